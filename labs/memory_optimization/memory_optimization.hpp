// Lab 3, memory optimization: the functions you implement (starter/memory_optimization/
// memory_optimization.cpp). GPU memory is the limit you hit first; this lab measures it and pulls
// the four levers: batch size, precision, gradient accumulation and activation checkpointing. The
// lab binary (apps/memory_optimization) measures memory and throughput per batch size, finds the
// largest batch that fits, trains beyond it with accumulation and trades compute for memory with
// checkpointing; tests/labs/memory_optimization_test.cpp grades your functions.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "amplab/activation_checkpoint.hpp"  // amplab::checkpoint (TODO 4)
#include "amplab/batch_finder.hpp"           // BatchSearch, BatchTrial, TrainingSnapshot (TODO 2)
#include "amplab/error.hpp"                  // AMPLAB_TODO in the starter
#include "amplab/memory.hpp"                 // read_memory, reset_peak_memory, is_out_of_memory (TODO 1)
#include "amplab/precision.hpp"
#include "amplab/trainer.hpp"                // Batch, LossFn

namespace memory_optimization {

// ---- Given: a model whose activations dominate its memory ------------------------------------

struct DeepMlpOptions {
  int64_t width = 512;    // features of the residual stream: (N, width) in and between blocks
  int64_t depth = 24;     // residual blocks
  int64_t expansion = 4;  // a block's hidden layer has expansion * width features
  int64_t classes = 10;   // outputs of the head
  double dropout = 0.0;   // dropout after each block's GELU (0: none)
};

// A transformer's MLP block: x + fc2(dropout(gelu(fc1(layer_norm(x))))). What backward needs from
// it, per sample, in fp32 with h = expansion * width: its input x (w floats, kept by layer_norm),
// layer_norm's output (w, kept by fc1), fc1's output (h, kept by gelu), gelu's output (h, kept by
// fc2): 2w + 2h floats, 10w at expansion 4, against 2w + 8w^2 parameters shared by the batch.
struct ResidualBlockImpl : torch::nn::Module {
  explicit ResidualBlockImpl(const DeepMlpOptions& options);
  torch::Tensor forward(const torch::Tensor& x);  // (N, width) -> (N, width)

  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear fc1{nullptr};       // width -> expansion * width
  torch::nn::Linear fc2{nullptr};       // expansion * width -> width
  torch::nn::Dropout dropout{nullptr};  // null when options.dropout is 0
  // Called after the block's forward and, through a hook, when backward has the gradient of its
  // output: the lab binary samples memory there for its timeline. Empty: nothing happens.
  std::function<void()> probe;
};
TORCH_MODULE(ResidualBlock);

// (N, width) -> (N, classes): `depth` residual blocks, a final layer norm, a linear head.
struct DeepMlpImpl : torch::nn::Module {
  explicit DeepMlpImpl(const DeepMlpOptions& options);
  torch::Tensor forward(const torch::Tensor& x);     // logits
  torch::Tensor run_blocks(const torch::Tensor& x);  // the residual blocks (TODO 4)
  void set_probe(const std::function<void()>& probe);  // on every block

  DeepMlpOptions options;
  torch::nn::Sequential blocks{nullptr};  // depth x ResidualBlock
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear head{nullptr};
  // 0: keep every activation. k >= 1: keep activations only at every k-th block boundary: the
  // blocks run in segments of k, and every segment but the last is checkpointed (TODO 4).
  int64_t checkpoint_every = 0;
};
TORCH_MODULE(DeepMlp);

// Given: mean cross-entropy of the model's logits against the batch's labels (the training loss).
torch::Tensor loss_of(DeepMlp& model, const amplab::Batch& batch);

// Given: `size` samples of (N, width) standard normal inputs, labelled by a fixed random linear
// "teacher" (width, classes): label = argmax(x @ teacher), so that the loss can fall. Draws from
// torch's generator of `device`.
amplab::Batch make_batch(int64_t size, const torch::Tensor& teacher, torch::Device device);

// Given: bytes one training step needs, estimated from the shapes (what a GPU allocator would be
// asked for; used to simulate a memory limit on the CPU and to print the expectation):
struct MemoryEstimate {
  int64_t fixed = 0;       // parameters, gradients, optimizer state, autocast's weight copies
  int64_t per_sample = 0;  // activations kept for backward plus one segment recomputed
  int64_t at(int64_t batch) const { return fixed + per_sample * batch; }
};
MemoryEstimate estimate_memory(const DeepMlpOptions& options, amplab::Precision precision, int64_t checkpoint_every,
                               bool momentum);

// ---- TODO 1: measuring ------------------------------------------------------------------------

struct Measurement {
  bool fits = false;              // every step ran without running out of memory
  std::string error;              // why not (amplab::oom_summary of the error); "" when it fit
  double peak_allocated_mib = 0;  // GPU: peak bytes held by tensors; CPU: process RSS high-water mark
  double peak_reserved_mib = 0;   // GPU: peak bytes the caching allocator held from the driver; CPU: RSS
  double step_ms = 0;             // median milliseconds of the timed steps (0 when it did not fit)
  int timed_steps = 0;            // steps timed (0 when it did not fit)
};
// TODO(memory_optimization-1): runs `step` (one training step: forward, backward, optimizer)
// `warmup` times untimed and then `steps` times timed one by one; measures peak memory from the
// first step to the last and catches running out of memory (fits = false) instead of throwing.
// Errors other than out-of-memory propagate.
Measurement measure(const std::function<void()>& step, torch::Device device, int warmup, int steps);

// ---- TODO 2: the largest batch that fits, and the fastest ------------------------------------

// Given: one trial of the search, with amplab's types: `fits` (when set) rejects the batch without
// running it; otherwise config.trial_steps steps of `step(batch)` through your measure() (the
// first untimed when there are two or more). Gradients left by a failed step are cleared.
amplab::BatchTrial try_batch(const amplab::BatchStep& step, torch::nn::Module& model, torch::Device device,
                             int64_t batch, const amplab::BatchFinderConfig& config, const amplab::FitsFn& fits);

// TODO(memory_optimization-2): the search of amplab::find_batch_size (src/amplab/batch_finder.hpp,
// same contract): grow by powers of two from config.start until a batch does not fit, bisect down
// to config.multiple_of, apply the safety margin, pick the batch with the best throughput, and
// leave the model, optimizer and generators as they were.
amplab::BatchSearch find_batch_size(const amplab::BatchStep& step, torch::nn::Module& model,
                                    torch::optim::Optimizer* optimizer, torch::Device device,
                                    const amplab::BatchFinderConfig& config, const amplab::FitsFn& fits = {});

// ---- TODO 3: gradient accumulation ------------------------------------------------------------

// TODO(memory_optimization-3): gradient accumulation, the trainer's (amplab::StepMechanisms's
// accumulate_gradients: what runs when train.accumulation_steps > 1). Accumulates into .grad the
// gradients of all the group's micro-batches together, as one backward of the whole batch's
// mean loss would, with one micro-batch's activations alive at a time; returns the mean loss
// over the whole group (0-dim, detached, on the device). Does not zero .grad first.
torch::Tensor accumulate_gradients(amplab::Trainer& trainer, const amplab::MicroBatches& group);

// Given: `batch` as micro-batches of at most `micro_batch` rows (the last may be smaller).
amplab::MicroBatches split_batch(const amplab::Batch& batch, int64_t micro_batch);

// ---- TODO 4: activation checkpointing is in DeepMlpImpl::run_blocks ---------------------------

// ---- TODO 5: comparing ------------------------------------------------------------------------

struct Comparison {
  double memory_saving = 0;  // baseline peak / this peak: 2 means half the memory (0: not comparable)
  double time_overhead = 0;  // this step time / the baseline's - 1: 0.3 means 30% slower (0: not comparable)
};
// TODO(memory_optimization-5): how `candidate` compares with `baseline` (peak allocated memory
// and step time). Both stay 0 when either did not fit or has no peak or time.
Comparison compare(const Measurement& baseline, const Measurement& candidate);

}  // namespace memory_optimization
