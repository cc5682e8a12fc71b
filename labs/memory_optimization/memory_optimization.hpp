// Lab 3, memory optimization: the functions you implement (starter/memory_optimization/
// memory_optimization.cpp). GPU memory is the limit you hit first; this lab measures it and pulls
// the four levers: batch size, precision, gradient accumulation and activation checkpointing. The
// lab binary (apps/memory_optimization) measures memory and throughput per batch size, finds the
// largest batch that fits, trains beyond it with accumulation and trades compute for memory with
// checkpointing, and hunts a leak in a training loop's loss history;
// tests/labs/memory_optimization_test.cpp grades your functions.
#pragma once

#include <torch/torch.h>

#include <algorithm>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "amplab/infra/config.hpp"             // Range (BatchFinderConfig's fields)
#include "amplab/infra/error.hpp"              // AMPLAB_TODO in the starter
#include "amplab/measure/memory.hpp"             // read_memory, reset_peak_memory, is_out_of_memory (TODO 1), MemoryTracker
#include "amplab/train/precision.hpp"
#include "amplab/train/trainer.hpp"            // Trainer, Batch, MicroBatches, LossFn
#include "given/training_snapshot.hpp"  // TrainingSnapshot (TODO 2)

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
  torch::Tensor run_blocks(const torch::Tensor& x);  // the residual blocks (checkpointed: TODO 5)
  void set_probe(const std::function<void()>& probe);  // on every block

  DeepMlpOptions options;
  torch::nn::Sequential blocks{nullptr};  // depth x ResidualBlock
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear head{nullptr};
  // 0: keep every activation. k >= 1: keep activations only at every k-th block boundary: the
  // blocks run in segments of k, and every segment but the last is checkpointed (TODO 5).
  int64_t checkpoint_every = 0;
};
TORCH_MODULE(DeepMlp);

// Given: mean cross-entropy of the model's logits against the batch's labels (the training loss).
torch::Tensor loss_of(DeepMlp& model, const amplab::Batch& batch);

// Given: `size` samples of (N, width) standard normal inputs, labelled by a fixed random linear
// "teacher" (width, classes): label = argmax(x @ teacher), so that the loss can fall. Draws from
// torch's generator of `device`.
amplab::Batch make_batch(int64_t size, const torch::Tensor& teacher, torch::Device device);

// TODO(memory_optimization-6): the memory one training step needs, from the shapes alone (what a
// GPU allocator will be asked for): `fixed` bytes alive through the whole step, `gradients` bytes
// alive from backward to the optimizer step, `per_sample` bytes for what the batch adds. The lab
// binary prints it beside the allocator's measured peak, and on the CPU uses it as a simulated
// memory limit for the batch finder.
struct MemoryEstimate {
  int64_t fixed = 0;       // parameters, optimizer state, autocast's weight copies
  int64_t gradients = 0;   // the parameters' .grad (zero_grad(set_to_none) frees them before forward)
  int64_t per_sample = 0;  // activations kept for backward, plus what backward needs while it runs
  // The activations peak when backward starts, before almost any gradient exists; the gradients
  // peak at the optimizer step, when the activations are gone. So the two never add up.
  int64_t at(int64_t batch) const { return fixed + std::max(gradients, per_sample * batch); }
};
// momentum: the optimizer keeps one buffer per parameter (SGD with momentum; Adam keeps two: see
// the README).
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

struct BatchFinderConfig {
  int64_t start = 8;
  int64_t max_batch = 1 << 20;
  int64_t multiple_of = 8;
  int64_t trial_steps = 2;
  double safety_margin = 0.1;

  template <class V>
  void fields(V& v) {
    v.field("start", start, "first batch tried (then doubled until one does not fit)",
            amplab::Range<int64_t>::at_least(1));
    v.field("max_batch", max_batch, "largest batch ever tried", amplab::Range<int64_t>::at_least(1));
    v.field("multiple_of", multiple_of, "batches tried are multiples of this (search resolution)",
            amplab::Range<int64_t>::at_least(1));
    v.field("trial_steps", trial_steps,
            "training steps per trial (the first one untimed: warm-up, where the optimizer state appears)",
            amplab::Range<int64_t>::between(1, 100));
    v.field("safety_margin", safety_margin,
            "recommended = largest fit x (1 - margin): room for fragmentation and longer inputs",
            amplab::Range<double>::between(0, 0.9));
  }
};

// One tried batch size.
struct BatchTrial {
  int64_t batch = 0;
  bool fits = false;
  bool ran = false;               // false: rejected by the injected check without running
  double step_ms = 0;             // median of the timed steps (0 when it did not fit or none were timed)
  double samples_per_second = 0;
  double peak_allocated_mib = 0;  // GPU: bytes held by tensors; CPU: process RSS high-water mark
  double peak_reserved_mib = 0;   // GPU: bytes the caching allocator held; CPU: RSS again
  std::string error;              // why it did not fit (first line of the OOM message)
};

struct BatchSearch {
  int64_t largest_fit = 0;      // the largest batch that ran (0: not even config.start did)
  int64_t smallest_oom = 0;     // the smallest batch that did not (0: all fit up to max_batch)
  int64_t recommended = 0;      // largest_fit with the safety margin, a multiple of multiple_of
  int64_t best_throughput = 0;  // the batch with the most samples/s among those that fit and were timed
  double best_samples_per_second = 0;
  std::vector<BatchTrial> trials;  // in the order tried
};

// One training step (forward, backward, optimizer) at `batch` samples. Throws an out-of-memory
// error (amplab::is_out_of_memory) when it does not fit; any other error ends the search.
using BatchStep = std::function<void(int64_t batch)>;
// A fake memory limit, injected: decides without running whether `batch` fits (tests, CPU demos).
// Empty: every batch is run and out-of-memory errors decide.
using FitsFn = std::function<bool(int64_t batch)>;

// Given: the batch with the most samples/s among trials that fit and were timed (0 and 0 when none).
std::pair<int64_t, double> best_throughput(const std::vector<BatchTrial>& trials);
// Given: `value` rounded down to a multiple of `multiple` (at least `multiple`).
int64_t round_down_to(int64_t value, int64_t multiple);

// TODO(memory_optimization-2): one trial of the search: `fits` (when set) rejects the batch
// without running it; otherwise config.trial_steps steps of `step(batch)` through your measure()
// (the first untimed when there are two or more), and after a failure nothing of the failed step
// may stay behind.
BatchTrial try_batch(const BatchStep& step, torch::nn::Module& model, torch::Device device, int64_t batch,
                     const BatchFinderConfig& config, const FitsFn& fits);

// TODO(memory_optimization-2): the largest batch that fits: grow by powers of two, then bisect
// down to config.multiple_of, recommend it with the safety margin, pick the fastest; the model,
// optimizer and generators end as they were (`optimizer` may be null).
BatchSearch find_batch_size(const BatchStep& step, torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                            torch::Device device, const BatchFinderConfig& config = {}, const FitsFn& fits = {});

// ---- TODO 3: gradient accumulation ------------------------------------------------------------

// TODO(memory_optimization-3): gradient accumulation, the trainer's (what Trainer::step runs
// when train.accumulation_steps > 1). Accumulates into .grad the
// gradients of all the group's micro-batches together, as one backward of the whole batch's
// mean loss would, with one micro-batch's activations alive at a time; returns the mean loss
// over the whole group (0-dim, detached, on the device). Does not zero .grad first.
torch::Tensor accumulate_gradients(amplab::Trainer& trainer, const amplab::MicroBatches& group);

// Given: `batch` as micro-batches of at most `micro_batch` rows (the last may be smaller).
amplab::MicroBatches split_batch(const amplab::Batch& batch, int64_t micro_batch);

// ---- TODO 4 and 5: activation checkpointing ------------------------------------------------------

// A segment of a network: one tensor in, one out (the residual blocks between two kept boundaries).
using Segment = std::function<torch::Tensor(const torch::Tensor&)>;

// TODO(memory_optimization-4): runs `segment` on `input` keeping none of its activations for
// backward, only `input` itself; when backward reaches it, the segment runs again (with the
// random numbers and the autocast state its forward saw) and the gradients flow on from there.
// `parameters` are every tensor requiring grad that the segment uses besides its input: each
// gets its gradient in .grad as without checkpointing. Without grad mode, or when nothing
// requires grad, the segment simply runs. preserve_rng_state = false replays without restoring
// the random generators (to see dropout's gradients go wrong).
torch::Tensor checkpoint(const Segment& segment, const torch::Tensor& input, const std::vector<torch::Tensor>& parameters,
                         bool preserve_rng_state = true);

// TODO(memory_optimization-5): the blocks of `sequential` in turn, keeping activations only at
// every `every`-th block boundary (every <= 0: all of them). What DeepMlp::run_blocks runs when
// checkpoint_every > 0.
torch::Tensor checkpoint_sequential(const torch::nn::Sequential& sequential, const torch::Tensor& input, int64_t every);

// ---- TODO 7: comparing ------------------------------------------------------------------------

struct Comparison {
  double memory_saving = 0;  // baseline peak / this peak: 2 means half the memory (0: not comparable)
  double time_overhead = 0;  // this step time / the baseline's - 1: 0.3 means 30% slower (0: not comparable)
};
// TODO(memory_optimization-7): how `candidate` compares with `baseline` (peak allocated memory
// and step time). Both stay 0 when either did not fit or has no peak or time.
Comparison compare(const Measurement& baseline, const Measurement& candidate);

// ---- TODO 8: a leak hunt ----------------------------------------------------------------------

// The loss history a training loop keeps for its log and its report: a loss recorded every step,
// turned into host numbers at log points (flush), and the running sum the log's mean comes from.
struct LossHistory {
  std::vector<torch::Tensor> pending;  // recorded since the last flush(), on the device they came from
  std::vector<double> values;          // every loss recorded up to the last flush(), in order
  torch::Tensor sum;                   // the sum of every recorded loss, 0-dim (undefined before the first)
  int64_t count = 0;                   // losses recorded

  // TODO(memory_optimization-8): keeps one step's `loss` (0-dim, maybe with an autograd graph)
  // for the history and adds it to `sum`, such that memory stays flat however many are recorded.
  void record(const torch::Tensor& loss);
  // TODO(memory_optimization-8): a log point: the pending losses, in order, become host numbers
  // appended to `values`; `pending` is empty again. Returns `values`.
  const std::vector<double>& flush();
  // Given: sum / count as a number (0 before the first record).
  double mean() const;
};

// What the leak hunt's loop hands each step's loss to: LossHistory::record, or the lab binary's
// leaky recording it compares yours with.
using RecordLoss = std::function<void(const torch::Tensor& loss)>;

// Given: the leak hunt's training loop. `steps` steps of `optimizer` on `model`, each on a fresh
// batch of `batch` samples (make_batch with `teacher`, on held_out's device); after each, the loss
// on the fixed batch `held_out`, evaluated the way this loop's author wrote it (in grad mode), goes
// to `record`. Then `after_step(step)`, when set, with nothing of the step alive but what record
// kept: the tests and the lab binary read memory there. A `tracker` gets each step's phases
// (forward, backward, optimizer, and `other` for the held-out loss) and end_step.
void train_with_history(DeepMlp& model, torch::optim::Optimizer& optimizer, const torch::Tensor& teacher,
                        const amplab::Batch& held_out, int64_t batch, int64_t steps, const RecordLoss& record,
                        const std::function<void(int64_t step)>& after_step = {},
                        amplab::MemoryTracker* tracker = nullptr);

}  // namespace memory_optimization
