// Your copy of this lab's code: fill in every TODO(...) below; the tests tell you which one
// fails. (Instructors: generated from solution/ by scripts/make-starter.py; edit the solution.)
// Lab 3, memory optimization: the model (given), measuring, the estimate, accumulation, the
// checkpointed blocks and the comparison. The batch finder is batch_finder.cpp, checkpointing
// checkpointing.cpp. Each TODO is one exercise; see labs/memory_optimization/README.md.
#include "memory_optimization.hpp"

#include <algorithm>
#include <tuple>

#include "amplab/infra/device.hpp"
#include "amplab/infra/error.hpp"
#include "amplab/measure/timing.hpp"

namespace memory_optimization {

// ---- Given: the model ---------------------------------------------------------------------------

ResidualBlockImpl::ResidualBlockImpl(const DeepMlpOptions& o) {
  norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.width})));
  fc1 = register_module("fc1", torch::nn::Linear(o.width, o.expansion * o.width));
  fc2 = register_module("fc2", torch::nn::Linear(o.expansion * o.width, o.width));
  if (o.dropout > 0) dropout = register_module("dropout", torch::nn::Dropout(o.dropout));
}

torch::Tensor ResidualBlockImpl::forward(const torch::Tensor& x) {
  torch::Tensor h = torch::gelu(fc1(norm(x)));  // (N, expansion * width)
  if (dropout) h = dropout(h);
  torch::Tensor out = x + fc2(h);               // (N, width)
  if (probe) {
    probe();
    if (out.requires_grad()) {
      auto p = probe;
      out.register_hook([p](const torch::Tensor&) { p(); });
    }
  }
  return out;
}

DeepMlpImpl::DeepMlpImpl(const DeepMlpOptions& o) : options(o) {
  blocks = register_module("blocks", torch::nn::Sequential());
  for (int64_t i = 0; i < o.depth; ++i) blocks->push_back(ResidualBlock(o));
  norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.width})));
  head = register_module("head", torch::nn::Linear(o.width, o.classes));
}

torch::Tensor DeepMlpImpl::forward(const torch::Tensor& x) { return head(norm(run_blocks(x))); }

void DeepMlpImpl::set_probe(const std::function<void()>& probe) {
  for (auto& block : *blocks) block.get<ResidualBlockImpl>().probe = probe;
}

torch::Tensor loss_of(DeepMlp& model, const amplab::Batch& batch) {
  return torch::nn::functional::cross_entropy(model->forward(batch.input), batch.target);
}

amplab::Batch make_batch(int64_t size, const torch::Tensor& teacher, torch::Device device) {
  torch::NoGradGuard no_grad;
  auto x = torch::randn({size, teacher.size(0)}, torch::TensorOptions().device(device));  // (N, width)
  auto y = torch::mm(x, teacher.to(device)).argmax(1);                                    // (N) int64
  return {x, y};
}

// TODO(memory_optimization-6): count bytes, as the allocator would be asked for them.
//  fixed: the parameters (count them from the shapes: each block has a layer norm's weight and
//    bias, two Linears' weights and biases; then the final norm and the head) in fp32, once more
//    per momentum buffer; under autocast (fp16/bf16-mixed) one 2-byte copy of every weight,
//    cached for the step.
//  gradients: one fp32 gradient per parameter. Not part of fixed: the trainer's zero_grad frees
//    them (set_to_none), and backward creates them last layer first, so when the activations
//    peak (backward's start) almost none exists yet. at() takes the larger of the two.
//  per_sample: what backward needs of each sample. Per block, the tensors autograd saves: its
//    input (kept by the layer norm), the norm's output (kept by fc1), fc1's output (kept by the
//    GELU), the GELU's output (kept by fc2), and dropout's mask when there is dropout. Under
//    autocast, find out which of those are half precision (the residual stream stays fp32; the
//    matmuls' inputs and outputs are half). With checkpointing every k blocks, only each
//    checkpointed segment's input is kept, plus, during backward, one segment's activations
//    recomputed (the larger of a full segment and the last, unchecked one). Add the head's
//    activations and what is in flight during backward (the gradients of the widest activations,
//    the input batch).
// Check yourself against the allocator's peak (the lab binary prints both); the tests allow a
// margin.
MemoryEstimate estimate_memory(const DeepMlpOptions& o, amplab::Precision precision, int64_t checkpoint_every,
                               bool momentum) {
  AMPLAB_TODO("memory_optimization-6");
}

// ---- TODO 1: measuring --------------------------------------------------------------------------

// TODO(memory_optimization-1): measures `warmup` untimed then `steps` timed calls of `step`
// (each timed by itself, with an amplab::DeviceTimer: CUDA events on a GPU) and the peak memory
// from the first call to the last (amplab::read_memory's peak allocated and reserved bytes, in
// MiB of 2^20), starting clean: nothing cached by earlier work (it would count as reserved) and
// the peaks reset. Running out of memory is a result, not an error: the Measurement says the step
// did not fit, with the one-line summary the core makes of an OOM (memory.hpp has the helpers
// that tell an OOM from other errors, which propagate), and the blocks the failed step left
// cached are freed so that the next attempt starts from the same memory. The step's time is the
// median of the timed steps; a negative warmup or fewer than one step is an amplab::Error.
// Pitfall: an exception leaves its tensors alive until it is destroyed; free the cache after the
// catch block has ended, not inside it.
Measurement measure(const std::function<void()>& step, torch::Device device, int warmup, int steps) {
  AMPLAB_TODO("memory_optimization-1");
}

// ---- TODO 3: gradient accumulation --------------------------------------------------------------

amplab::MicroBatches split_batch(const amplab::Batch& batch, int64_t micro_batch) {
  if (micro_batch < 1) throw amplab::Error("split_batch: micro_batch must be at least 1");
  const int64_t n = batch.size();
  auto rows = [n, micro_batch](int64_t i) { return std::min(micro_batch, n - i * micro_batch); };
  return {(n + micro_batch - 1) / micro_batch, rows, [batch, micro_batch, rows](int64_t i) {
            return amplab::Batch{batch.input.narrow(0, i * micro_batch, rows(i)), batch.target.narrow(0, i * micro_batch, rows(i))};
          }};
}

// TODO(memory_optimization-3): for each micro-batch in turn: its loss from
// trainer.forward_loss(micro_batch, last) under an amplab::AutocastGuard for the trainer's device
// and precision (`last`: whether it is the group's last micro-batch, after whose backward
// data-parallel training all-reduces), then backward of the loss scaled by the trainer's
// scaler. Each loss is a mean over its own rows while the group's is a mean over all of them:
// weight it by rows / total before backward, or a smaller last micro-batch counts as much as a
// full one. backward() adds into .grad, and frees the micro-batch's activations before the next
// one runs. Sum the weighted losses (detached) for the result.
// Pitfall: summing the losses and calling backward once keeps every micro-batch's activations.
torch::Tensor accumulate_gradients(amplab::Trainer& trainer, const amplab::MicroBatches& group) {
  AMPLAB_TODO("memory_optimization-3");
}

// ---- TODO 5: the blocks in checkpointed segments ------------------------------------------------

torch::Tensor DeepMlpImpl::run_blocks(const torch::Tensor& input) {
  if (checkpoint_every > 0 && torch::GradMode::is_enabled()) return checkpoint_sequential(blocks, input, checkpoint_every);
  torch::Tensor x = input;  // without checkpointing, or without a graph to save memory in (evaluation)
  for (auto& block : *blocks) x = block.forward(x);
  return x;
}

// TODO(memory_optimization-5): the blocks of `sequential` in turn, keeping activations only at
// every `every`-th block boundary: cut them into segments of `every` blocks and run each segment
// but the last through your checkpoint() (TODO 4), with every parameter of its blocks; run the last
// segment plainly, since its backward comes first and recomputing it would save nothing (PyTorch's
// checkpoint_sequential does the same). every <= 0: no checkpointing at all.
// Pitfalls: backward calls a segment again later, so what it captures must outlive this call
// (the Sequential's shared pointer, not a reference); a parameter left out of the list gets no
// gradient.
torch::Tensor checkpoint_sequential(const torch::nn::Sequential& sequential, const torch::Tensor& input, int64_t every) {
  AMPLAB_TODO("memory_optimization-5");
}

// ---- TODO 7: comparing -----------------------------------------------------------------------

// TODO(memory_optimization-7): how the candidate compares with the baseline: memory_saving, how many
// times less peak allocated memory it needs (2.0: half), and time_overhead, the share of time it
// adds to a step (0.3: 30% slower; negative when faster). Only when both fit and both measured a
// positive peak and time; otherwise both stay 0.
Comparison compare(const Measurement& baseline, const Measurement& candidate) {
  AMPLAB_TODO("memory_optimization-7");
}

}  // namespace memory_optimization
