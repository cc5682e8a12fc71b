// Your copy of this lab's code: fill in every TODO(...) below; the tests tell you which one
// fails. (Instructors: generated from solution/ by scripts/make-starter.py; edit the solution.)
// Lab 3, memory optimization. Each TODO below is one exercise; see labs/memory_optimization/README.md.
#include "memory_optimization.hpp"

#include <algorithm>
#include <tuple>

#include "amplab/device.hpp"
#include "amplab/error.hpp"
#include "amplab/timing.hpp"

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

MemoryEstimate estimate_memory(const DeepMlpOptions& o, amplab::Precision precision, int64_t checkpoint_every,
                               bool momentum) {
  const int64_t w = o.width, h = o.expansion * o.width, depth = o.depth;
  const int64_t parameters = depth * (2 * w + w * h + h + h * w + w) + 2 * w + w * o.classes + o.classes;
  const bool half = amplab::is_mixed(precision);
  MemoryEstimate e;
  // fp32 weights and gradients (+ momentum); autocast keeps fp16/bf16 copies of the weights.
  e.fixed = parameters * 4 * (momentum ? 3 : 2) + (half ? parameters * 2 : 0);
  // Bytes one block keeps per sample. fp32: x, norm(x), fc1's and gelu's outputs. Under autocast
  // x stays fp32 (the residual add promotes), layer_norm runs in fp32 and fc1 keeps a half copy
  // of its output; fc1's and gelu's outputs are half. Dropout adds a one-byte mask.
  int64_t block = half ? 4 * w + 2 * w + 2 * h + 2 * h : 4 * w + 4 * w + 4 * h + 4 * h;
  if (o.dropout > 0) block += h;
  int64_t kept = depth * block;
  if (checkpoint_every > 0 && checkpoint_every < depth) {
    const int64_t segments = (depth + checkpoint_every - 1) / checkpoint_every;
    const int64_t checkpointed = segments - 1;
    const int64_t last = depth - checkpointed * checkpoint_every;
    // Segment inputs, plus the larger of the last segment (kept) and one segment recomputed.
    kept = checkpointed * 4 * w + std::max(last, checkpoint_every) * block;
  }
  const int64_t head = 4 * w + (half ? 2 : 4) * w + 4 * o.classes;
  const int64_t in_flight = 2 * (half ? 2 : 4) * h + 4 * w + 4 * w;  // gradients of activations during backward, the input
  e.per_sample = kept + head + in_flight;
  return e;
}

// ---- TODO 1: measuring --------------------------------------------------------------------------

Measurement measure(const std::function<void()>& step, torch::Device device, int warmup, int steps) {
  if (warmup < 0 || steps < 1) throw amplab::Error("measure: need warmup >= 0 and steps >= 1");
  Measurement m;
  std::vector<double> ms;  // one entry per timed step
  // TODO(memory_optimization-1): Start clean: amplab::free_cached_memory(device) (the allocator's
  // cached blocks from earlier work would otherwise count as reserved) and
  // amplab::reset_peak_memory(device). Then, inside try: `warmup` calls of step(), then
  // amplab::synchronize(device), then `steps` calls each bracketed by an amplab::DeviceTimer
  // (start(); step(); ms.push_back(stop_ms())), and m.fits = true. Catch const std::exception& e:
  // when amplab::is_out_of_memory(e), set m.error = amplab::oom_summary(e) and free the cache
  // (what the failed step left cached); any other error: rethrow (`throw;`). In both cases read
  // the peaks afterwards with amplab::read_memory(device): peak_allocated and peak_reserved are in
  // bytes (1 MiB = 2^20 bytes).
  AMPLAB_TODO("memory_optimization-1");
  if (m.fits) {
    m.step_ms = amplab::summarize(ms).median;
    m.timed_steps = static_cast<int>(ms.size());
  }
  return m;
}

// ---- TODO 2: the batch-size search --------------------------------------------------------------

amplab::BatchTrial try_batch(const amplab::BatchStep& step, torch::nn::Module& model, torch::Device device,
                             int64_t batch, const amplab::BatchFinderConfig& config, const amplab::FitsFn& fits) {
  amplab::BatchTrial trial;
  trial.batch = batch;
  if (fits && !fits(batch)) {
    trial.error = "over the memory limit (injected check)";
    return trial;
  }
  trial.ran = true;
  const int warmup = config.trial_steps > 1 ? 1 : 0;  // the first step creates the optimizer state
  Measurement m = measure([&] { step(batch); }, device, warmup, static_cast<int>(config.trial_steps) - warmup);
  trial.fits = m.fits;
  trial.error = m.error;
  trial.peak_allocated_mib = m.peak_allocated_mib;
  trial.peak_reserved_mib = m.peak_reserved_mib;
  trial.step_ms = m.step_ms;
  if (m.fits && m.step_ms > 0) trial.samples_per_second = static_cast<double>(batch) / (m.step_ms / 1e3);
  if (!m.fits) model.zero_grad(/*set_to_none=*/true);  // gradients half written by the failed backward
  return trial;
}

amplab::BatchSearch find_batch_size(const amplab::BatchStep& step, torch::nn::Module& model,
                                    torch::optim::Optimizer* optimizer, torch::Device device,
                                    const amplab::BatchFinderConfig& config, const amplab::FitsFn& fits) {
  if (config.start < 1 || config.multiple_of < 1 || config.max_batch < 1 || config.trial_steps < 1)
    throw amplab::Error("find_batch_size: start, multiple_of, max_batch and trial_steps must be at least 1");
  amplab::BatchSearch search;
  // TODO(memory_optimization-2): The search.
  // 1. Take an amplab::TrainingSnapshot(model, optimizer) first; after every trial call its
  //    restore(), so that each trial starts from the same state and none leaks into training
  //    (host copies: the snapshot takes no GPU memory from the trials).
  // 2. Every batch you try is a multiple of m = config.multiple_of and at most
  //    amplab::round_down_to(config.max_batch, m). Try batches with try_batch(...) and keep every
  //    trial, in order, in search.trials.
  // 3. Grow: start at config.start rounded up to a multiple of m; while it fits and is below the
  //    maximum, double it (capped at the maximum). lo = the largest batch that fit so far (0: none),
  //    hi = the first that did not (0: none).
  // 4. Bisect while hi > 0 and hi - lo > m: mid = lo + (hi - lo) / 2 rounded down to a multiple
  //    of m (at least lo + m); it fits -> lo = mid, else hi = mid.
  // 5. search.largest_fit = lo, search.smallest_oom = hi. When lo > 0: search.recommended =
  //    floor(lo * (1 - config.safety_margin)) rounded down to a multiple of m (round_down_to),
  //    and at most lo.
  // 6. search.best_throughput / best_samples_per_second: amplab::best_throughput(search.trials).
  // If a trial throws (an error other than out-of-memory), restore the snapshot and rethrow.
  AMPLAB_TODO("memory_optimization-2");
  return search;
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

// ---- TODO 4: activation checkpointing -----------------------------------------------------------

torch::Tensor DeepMlpImpl::run_blocks(const torch::Tensor& input) {
  torch::Tensor x = input;
  // Without checkpointing, or without a graph to save memory in (evaluation): block after block.
  if (checkpoint_every <= 0 || !torch::GradMode::is_enabled()) {
    for (auto& block : *blocks) x = block.forward(x);
    return x;
  }
  // TODO(memory_optimization-4): Keep activations only at every checkpoint_every-th block
  // boundary. Cut the blocks into segments [begin, begin + checkpoint_every); run each segment but
  // the last through amplab::checkpoint(segment, x, parameters): `segment` is a function
  // Tensor -> Tensor running blocks begin..end-1 in turn ((seq->begin() + i)->forward(t), with
  // seq = blocks.ptr() captured by value, not `this`: backward calls the segment again later), and
  // `parameters` lists every parameter of those blocks ((seq->begin() + i)->ptr()->parameters()):
  // a parameter left out gets no gradient. Run the last segment (the blocks from the last `begin` to the end) normally:
  // its backward comes first, so recomputing it would save nothing. (amplab::checkpoint_sequential
  // does all this; write it yourself here.)
  AMPLAB_TODO("memory_optimization-4");
  return x;
}

// ---- TODO 5: comparing --------------------------------------------------------------------------

Comparison compare(const Measurement& baseline, const Measurement& candidate) {
  Comparison c;
  // TODO(memory_optimization-5): When both fit and have a positive peak_allocated_mib and
  // step_ms: memory_saving = baseline peak / candidate peak, time_overhead = candidate step_ms /
  // baseline step_ms - 1. Otherwise leave both 0.
  AMPLAB_TODO("memory_optimization-5");
  return c;
}

}  // namespace memory_optimization
