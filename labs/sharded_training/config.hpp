// The sharded_training lab's config: the keys of configs/sharded_training.yaml and what each means.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <span>
#include <utility>

#include "amplab/dist/world.hpp"
#include "amplab/infra/config.hpp"
#include "amplab/report/run_dir.hpp"

namespace zero_lab {

// The models the stages train (models.hpp).
enum class ModelKind { mlp, gpt };
inline constexpr std::pair<ModelKind, const char*> kModelKindNames[] = {{ModelKind::mlp, "mlp"}, {ModelKind::gpt, "gpt"}};
inline std::span<const std::pair<ModelKind, const char*>> enum_names(ModelKind) { return kModelKindNames; }

struct ZeroModelConfig {
  ModelKind kind = ModelKind::mlp;
  int64_t width = 1024, layers = 4, batch = 64;
  int64_t heads = 4, context = 64, vocab = 256;

  template <class V>
  void fields(V& v) {
    v.field("kind", kind,
            "mlp: layers x Linear(width, width) with ReLU between; gpt: lab 7's GPT with GPT-2's biases, its "
            "output layer tied to the token embedding (GPT-2 medium: layers 24, width 1024, heads 16, context 1024, "
            "vocab 50304)");
    v.field("width", width, "width of the MLP, or the GPT's embedding width", amplab::Range<int64_t>::at_least(1));
    v.field("layers", layers, "Linear layers of the MLP, or the GPT's blocks", amplab::Range<int64_t>::at_least(1));
    v.field("batch", batch,
            "samples (MLP) or sequences of model.context tokens (GPT) per rank per step (the global batch is "
            "world size x batch)",
            amplab::Range<int64_t>::at_least(1));
    v.field("heads", heads, "the GPT's attention heads (model.width must be a multiple)", amplab::Range<int64_t>::at_least(1));
    v.field("context", context, "the GPT's sequence length", amplab::Range<int64_t>::at_least(1));
    v.field("vocab", vocab, "the GPT's vocabulary (random tokens)", amplab::Range<int64_t>::at_least(2));
  }

  // The model's parameters (the GPT's tied matrix once), without building it.
  int64_t parameter_count() const {
    if (kind == ModelKind::mlp) return layers * (width * width + width);
    return vocab * width + context * width + 2 * width + layers * (12 * width * width + 13 * width);
  }
  // Of those, the ones ZeRO-3 gathers once a step (the GPT's embeddings and final LayerNorm,
  // kept whole from forward to backward).
  int64_t gathered_once() const { return kind == ModelKind::mlp ? 0 : vocab * width + context * width + 2 * width; }
};

struct ZeroTrainConfig {
  int steps = 30, warmup = 3;
  double lr = 1e-3, weight_decay = 0.01;

  template <class V>
  void fields(V& v) {
    v.field("steps", steps, "optimizer steps each stage trains (the same data for every stage)",
            amplab::Range<int64_t>::at_least(1));
    v.field("warmup", warmup, "of those, the first steps left out of the step time", amplab::Range<int64_t>::at_least(0));
    v.field("lr", lr, "AdamW's learning rate", amplab::Range<double>::positive());
    v.field("weight_decay", weight_decay, "AdamW's decoupled weight decay", amplab::Range<double>::at_least(0));
  }
};

// The dtypes FSDP's mixed precision chooses between.
enum class FsdpDtype { float32, bfloat16 };
inline constexpr std::pair<FsdpDtype, const char*> kFsdpDtypeNames[] = {{FsdpDtype::float32, "float32"},
                                                                        {FsdpDtype::bfloat16, "bfloat16"}};
inline std::span<const std::pair<FsdpDtype, const char*>> enum_names(FsdpDtype) { return kFsdpDtypeNames; }

struct ZeroFsdpConfig {
  FsdpDtype param_dtype = FsdpDtype::float32, reduce_dtype = FsdpDtype::float32;

  bool fp32() const { return param_dtype == FsdpDtype::float32 && reduce_dtype == FsdpDtype::float32; }
  static torch::ScalarType scalar_type(FsdpDtype d) { return d == FsdpDtype::bfloat16 ? torch::kBFloat16 : torch::kFloat32; }
  template <class V>
  void fields(V& v) {
    v.field("param_dtype", param_dtype, "ZeRO-3's all-gathers and layer compute (its shards and step stay float32)");
    v.field("reduce_dtype", reduce_dtype, "the dtype ZeRO-3's gradients are reduce-scattered in");
  }
};

struct ZeroMemoryConfig {
  int64_t cap_mib = 0;
  bool expandable_segments = false;

  template <class V>
  void fields(V& v) {
    v.field("cap_mib", cap_mib,
            "caps what each rank's CUDA allocator may hold, in MiB (0: the whole GPU): a stage that needs more "
            "is reported out of memory and the next stage still runs (GPU only)",
            amplab::Range<int64_t>::at_least(0));
    v.field("expandable_segments", expandable_segments,
            "the CUDA allocator grows its segments in place instead of reserving new ones of fixed sizes "
            "(PyTorch's PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; the README's question 6) (GPU only)");
  }
};

struct ZeroConfig {
  amplab::RunConfig run;
  amplab::dist::ProcessGroupConfig dist;
  ZeroModelConfig model;
  ZeroTrainConfig train;
  ZeroFsdpConfig fsdp;
  ZeroMemoryConfig memory;

  template <class V>
  void fields(V& v) {
    v.section("run", run);
    v.section("dist", dist);
    v.section("model", model);
    v.section("train", train);
    v.section("fsdp", fsdp);
    v.section("memory", memory);
  }
};

}  // namespace zero_lab
