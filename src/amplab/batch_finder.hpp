// The largest batch that fits, found by trying: grow the batch by powers of two until a training
// step runs out of memory, then binary-search between the last batch that fit and the first that
// did not. Each trial runs real training steps (forward, backward, optimizer), so everything a
// step allocates counts: activations, gradients, optimizer state, workspaces, fragmentation.
// Out-of-memory errors are caught, the allocator's cache is freed, and the search goes on; the
// model and optimizer are put back as they were before the search.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "amplab/config.hpp"

namespace amplab {

// Host copies of everything a few training steps change: the parameters, buffers and gradients of
// a model, the state of its optimizer (momentum, Adam moments and step counts, learning rates) and
// torch's CPU and CUDA random generators. Host copies, so that the snapshot does not take GPU memory
// that the steps it protects would otherwise have.
class TrainingSnapshot {
 public:
  TrainingSnapshot(torch::nn::Module& model, torch::optim::Optimizer* optimizer);
  // Puts everything back: values copied into the same tensors (the optimizer's state stays keyed
  // to them), gradients as they were (undefined ones undefined again), optimizer state replaced
  // (state created since the snapshot is dropped), generators reset.
  void restore();

 private:
  torch::nn::Module& model_;
  torch::optim::Optimizer* optimizer_;
  std::vector<torch::Tensor> parameters_;  // host copies, in model.parameters() order
  std::vector<torch::Tensor> grads_;       // host copies; undefined where the gradient was
  std::vector<torch::Tensor> buffers_;     // host copies, in model.buffers() order
  // The optimizer's per-parameter state as host copies, by position among its parameters (SGD,
  // Adam, AdamW), and its param groups' options; other optimizers go through their own
  // serialization (slower: an archive per restore).
  std::vector<std::pair<size_t, std::unique_ptr<torch::optim::OptimizerParamState>>> optimizer_states_;
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> group_options_;
  bool serialized_ = false;
  std::string optimizer_archive_;
  torch::Tensor cpu_rng_;
  std::vector<std::pair<c10::DeviceIndex, torch::Tensor>> cuda_rng_;
};

struct BatchFinderConfig {
  int64_t start = 8;            // first batch tried; then doubled until one does not fit
  int64_t max_batch = 1 << 20;  // never tried beyond this
  int64_t multiple_of = 8;      // every batch tried is a multiple of this: the search's resolution
  int64_t trial_steps = 2;      // training steps per trial; the first is warm-up (optimizer state appears), the rest are timed
  double safety_margin = 0.1;   // recommended = largest fit x (1 - margin): room for fragmentation and longer inputs
  bool free_cache = true;       // empty the allocator's cache before each trial (each starts from the same state)

  template <class V>
  void fields(V& v) {
    v.field("start", start, "first batch tried (then doubled)", Range<int64_t>::at_least(1));
    v.field("max_batch", max_batch, "largest batch ever tried", Range<int64_t>::at_least(1));
    v.field("multiple_of", multiple_of, "batches tried are multiples of this (search resolution)", Range<int64_t>::at_least(1));
    v.field("trial_steps", trial_steps, "training steps per trial (first one untimed)", Range<int64_t>::between(1, 100));
    v.field("safety_margin", safety_margin, "recommended = largest fit x (1 - margin)", Range<double>::between(0, 0.9));
    v.field("free_cache", free_cache, "empty the CUDA caching allocator before each trial");
  }
};

// One tried batch size.
struct BatchTrial {
  int64_t batch = 0;
  bool fits = false;
  bool ran = false;                // false: rejected by the injected check without running
  double step_ms = 0;              // median of the timed steps (0 when it did not fit or none were timed)
  double samples_per_second = 0;
  double peak_allocated_mib = 0;   // GPU: bytes held by tensors; CPU: process RSS high-water mark
  double peak_reserved_mib = 0;    // GPU: bytes the caching allocator held; CPU: RSS again
  std::string error;               // why it did not fit (first line of the OOM message)
};

struct BatchSearch {
  int64_t largest_fit = 0;       // the largest batch that ran (0: not even config.start did)
  int64_t smallest_oom = 0;      // the smallest batch that did not (0: all fit up to max_batch)
  int64_t recommended = 0;       // largest_fit with the safety margin, a multiple of multiple_of (>= 1 when anything fit)
  int64_t best_throughput = 0;   // the batch with the most samples/s among those that fit and were timed
  double best_samples_per_second = 0;
  std::vector<BatchTrial> trials;  // in the order tried
};

// One training step (forward, backward, optimizer) at `batch` samples. Throws an out-of-memory
// error (is_out_of_memory) when it does not fit; any other error ends the search.
using BatchStep = std::function<void(int64_t batch)>;
// A fake memory limit, injected: decides without running whether `batch` fits (tests, CPU demos).
// Empty: every batch is run and out-of-memory errors decide.
using FitsFn = std::function<bool(int64_t batch)>;

// The search: batches config.start, 2x, 4x, ... (rounded up to multiple_of, capped at max_batch)
// until one does not fit, then bisection between the last fit and the first OOM down to
// multiple_of. After a failed trial: gradients cleared, allocator cache freed. Afterwards the
// model, optimizer and generators are restored (TrainingSnapshot), also when `step` throws
// something else (which is then rethrown). `optimizer` may be null.
BatchSearch find_batch_size(const BatchStep& step, torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                            torch::Device device, const BatchFinderConfig& config = {}, const FitsFn& fits = {});

// The batch with the most samples/s among trials that fit and were timed (0 and 0 when none).
std::pair<int64_t, double> best_throughput(const std::vector<BatchTrial>& trials);

// `value` rounded down to a multiple of `multiple` (at least `multiple`).
int64_t round_down_to(int64_t value, int64_t multiple);

}  // namespace amplab
