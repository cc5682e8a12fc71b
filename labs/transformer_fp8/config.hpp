// The transformer_fp8 lab's config: the keys of configs/transformer_fp8.yaml and what each means.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "amplab/infra/config.hpp"
#include "amplab/infra/paths.hpp"
#include "amplab/report/run_dir.hpp"
#include "amplab/train/trainer.hpp"

namespace transformer_fp8 {

using amplab::Range;

// ---- Config: the GPU's values (configs/transformer_fp8.yaml's cpu: section has the CPU's) -------

struct GptConfig {
  // The defaults are nanoGPT's Shakespeare-char model.
  int64_t n_layer = 6, n_head = 6, n_embd = 384, block_size = 256, batch = 64;
  double dropout = 0.2;
  std::string attention = "sdpa", fp8_scaling = "dynamic";
  int64_t amax_history = 16;
  template <class V>
  void fields(V& v) {
    v.field("n_layer", n_layer, "transformer blocks", Range<int64_t>::between(1, 96));
    v.field("n_head", n_head, "attention heads (n_embd must be a multiple)", Range<int64_t>::between(1, 128));
    v.field("n_embd", n_embd, "width C (FP8 on a GPU: a multiple of 16)", Range<int64_t>::between(8, 16384));
    v.field("block_size", block_size, "context length T", Range<int64_t>::between(4, 8192));
    v.field("batch", batch, "sequences per step (FP8 on a GPU: batch x block_size a multiple of 16)", Range<int64_t>::at_least(1));
    v.field("dropout", dropout, "dropout probability", Range<double>::between(0, 0.9));
    v.choice("attention", attention, {"math", "safe", "sdpa"}, "attention of the precision study");
    v.choice("fp8_scaling", fp8_scaling, {"dynamic", "delayed"}, "scaling of the fp8 row's linear layers");
    v.field("amax_history", amax_history, "steps of amax history (delayed scaling)", Range<int64_t>::between(1, 1024));
  }
};

struct StudyConfig {
  std::vector<std::string> rows = {"fp32", "tf32", "fp16", "fp16-no-scaler", "bf16", "fp8"};
  int64_t steps = 300, eval_every = 100, eval_iters = 20, warmup = 10, attention_steps = 30, sample_tokens = 300;
  // The defaults are nanoGPT's Shakespeare-char schedule.
  int64_t lr_warmup_steps = 100, lr_decay_steps = 5000;
  double min_lr = 1e-4;
  bool attention_study = true, fp8_mlp = true, plots = true;
  template <class V>
  void fields(V& v) {
    v.field("rows", rows, "precisions trained", {"fp32", "tf32", "fp16", "fp16-no-scaler", "bf16", "fp8"});
    v.field("steps", steps, "optimizer steps per row", Range<int64_t>::at_least(1));
    v.field("eval_every", eval_every, "steps between validation losses", Range<int64_t>::at_least(1));
    v.field("eval_iters", eval_iters, "validation batches per evaluation", Range<int64_t>::at_least(1));
    v.field("warmup", warmup, "first steps left out of ms/step", Range<int64_t>::at_least(0));
    v.field("lr_warmup_steps", lr_warmup_steps, "steps over which the learning rate rises linearly to train.optimizer.lr (nanoGPT's warmup_iters)",
            Range<int64_t>::at_least(0));
    v.field("lr_decay_steps", lr_decay_steps, "step where the cosine decay after the warm-up reaches min_lr (nanoGPT's lr_decay_iters)",
            Range<int64_t>::at_least(1));
    v.field("min_lr", min_lr, "learning rate at the end of the cosine decay (nanoGPT's min_lr)", Range<double>::at_least(0));
    v.field("attention_study", attention_study, "time math, safe and SDPA attention");
    v.field("attention_steps", attention_steps, "steps per attention kind", Range<int64_t>::at_least(2));
    v.field("fp8_mlp", fp8_mlp, "GPU: the FP8 MLP (4 x Linear(8192), batch 8192) and matmul tables against bf16");
    v.field("sample_tokens", sample_tokens, "characters generated at the end (0: none)", Range<int64_t>::at_least(0));
    v.field("plots", plots, "write loss_curve.png (needs matplotlib)");
  }
};

struct DataConfig {
  std::string dir = "data/shakespeare";
  template <class V>
  void fields(V& v) {
    v.field("dir", dir, "train.txt and val.txt (scripts/fetch-shakespeare.py), or one text file", amplab::check_path_value);
  }
};

struct LabConfig {
  amplab::RunConfig run;
  DataConfig data;
  amplab::StepSettings train{/*grad_clip_norm=*/1.0};
  GptConfig gpt;
  StudyConfig study;
  template <class V>
  void fields(V& v) {
    v.section("run", run);
    v.section("data", data);
    v.section("train", train);
    v.section("gpt", gpt);
    v.section("study", study);
  }
};

}  // namespace transformer_fp8
