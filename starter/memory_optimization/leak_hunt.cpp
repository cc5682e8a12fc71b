// Your copy of this lab's code: fill in every TODO(...) below; the tests tell you which one
// fails. (Instructors: generated from solution/ by scripts/make-starter.py; edit the solution.)
// Lab 3: the leak hunt (TODO 8), a loss history whose memory stays flat however long the loop
// runs. See labs/memory_optimization/README.md.
#include "memory_optimization.hpp"

namespace memory_optimization {

void train_with_history(DeepMlp& model, torch::optim::Optimizer& optimizer, const torch::Tensor& teacher,
                        const amplab::Batch& held_out, int64_t batch, int64_t steps, const RecordLoss& record,
                        const std::function<void(int64_t step)>& after_step, amplab::MemoryTracker* tracker) {
  const torch::Device device = held_out.input.device();
  auto phase = [tracker](amplab::Phase p) {
    if (tracker) tracker->begin(p);
  };
  for (int64_t step = 0; step < steps; ++step) {
    {  // everything of the step is gone at the end of this block, but what `record` kept
      amplab::Batch data = make_batch(batch, teacher, device);
      optimizer.zero_grad(/*set_to_none=*/true);
      phase(amplab::Phase::forward);
      torch::Tensor loss = loss_of(model, data);
      phase(amplab::Phase::backward);
      loss.backward();
      phase(amplab::Phase::optimizer);
      optimizer.step();
      phase(amplab::Phase::other);
      record(loss_of(model, held_out));
    }
    if (tracker) tracker->end_step(step);
    if (after_step) after_step(step);
  }
}

double LossHistory::mean() const {
  return count > 0 && sum.defined() ? sum.item<double>() / static_cast<double>(count) : 0.0;
}

// TODO(memory_optimization-8): record one step's loss.
// What you are handed: the loop computed this loss in grad mode, so it has a grad_fn, the last
// node of a graph that reaches back through the whole forward; each node holds what its backward
// would need (the blocks' inputs, the layer norms', fc1's and GELU's outputs: every activation of
// that forward). backward() would free those as it went; no backward ever runs on this loss, so
// they live exactly as long as something can still reach the graph: this tensor, or any tensor
// computed from it that requires grad (its grad_fn points back into the same graph).
// Why .detach() is enough: it returns a tensor that shares the loss's storage (its 4 bytes) but
// has no grad_fn and does not require grad. Nothing of the graph is reachable from it, so once the
// loop's own handle to the loss goes, the whole graph and its activations are freed.
// Keep the step's value in `pending` (no host number yet: see flush), add it to `sum`, count it.
// Pitfalls:
//  - Keeping a tensor that reaches the graph leaks one forward's activations per step. Pushing
//    the loss as it came does; so does a running `sum = sum + loss` (every addition's node points
//    at the last sum and at this step's graph: the chain holds every step's graph).
//  - .item() here is correct and flat too, but on a GPU it is a synchronization every step: the
//    host waits for the GPU to finish all the work queued so far before it can read the number,
//    so the next step's kernels are not queued while this one runs, and the GPU idles while the
//    host launches them. That costs when steps are short (launch-bound, a few ms); for a step of
//    hundreds of ms it is noise. flush() reads the numbers at log points instead.
void LossHistory::record(const torch::Tensor& loss) {
  AMPLAB_TODO("memory_optimization-8");
}

// TODO(memory_optimization-8): a log point. Append the pending losses to `values` as host
// numbers, in the order they were recorded, empty `pending` and return `values`. On a GPU, one
// copy of them all (torch::stack, then to the CPU) is one synchronization per log point instead
// of one per loss.
const std::vector<double>& LossHistory::flush() {
  AMPLAB_TODO("memory_optimization-8");
}

}  // namespace memory_optimization
