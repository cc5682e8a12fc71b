// Your copy of this lab's code: fill in every TODO(...) below; the tests tell you which one
// fails. (Instructors: generated from solution/ by scripts/make-starter.py; edit the solution.)
// Lab 3: the batch-size finder (TODO 2). See labs/memory_optimization/README.md.
#include <algorithm>
#include <cmath>
#include <tuple>

#include "amplab/infra/device.hpp"
#include "amplab/infra/error.hpp"
#include "memory_optimization.hpp"

namespace memory_optimization {

std::pair<int64_t, double> best_throughput(const std::vector<BatchTrial>& trials) {
  std::pair<int64_t, double> best{0, 0.0};
  for (const auto& t : trials)
    if (t.fits && t.step_ms > 0 && t.samples_per_second > best.second) best = {t.batch, t.samples_per_second};
  return best;
}

int64_t round_down_to(int64_t value, int64_t multiple) { return std::max(multiple, value / multiple * multiple); }

// TODO(memory_optimization-2): a trial. When `fits` is set and says no, return a trial that did
// not run (ran = false) with an error saying so. Otherwise run it through your measure():
// config.trial_steps steps of step(batch), the first untimed when there are two or more (it
// creates the optimizer state), and copy what measure() found into the trial, with samples per
// second from the median step time.
// After a failure nothing of the failed step may stay behind: the gradients its backward half
// wrote are still referenced by the model (drop them), and only then are their blocks free for
// the allocator to release. The tests check that allocated memory is back at its baseline after
// every failed trial.
BatchTrial try_batch(const BatchStep& step, torch::nn::Module& model, torch::Device device, int64_t batch,
                     const BatchFinderConfig& config, const FitsFn& fits) {
  AMPLAB_TODO("memory_optimization-2");
}

// TODO(memory_optimization-2): the search (README, "The batch-size finder").
//  - The model, the optimizer and the generators are as they were before the search after every
//    trial, and after the search, also when a trial throws (then rethrow): the core's
//    TrainingSnapshot keeps host copies of them, so it takes no GPU memory from the trials.
//  - Every batch tried is a multiple of config.multiple_of and no larger than config.max_batch
//    allows; every trial is kept, in order, in search.trials (try_batch makes them).
//  - Grow: from config.start (rounded up to the multiple), doubling (never past the maximum) while
//    batches fit. Then bisect between the largest that fit and the first that did not, until they
//    are one multiple apart (each midpoint on the multiple, above the low end).
//  - The result: the largest batch that fit and the smallest that did not (0 when every one fit),
//    the recommended batch (the largest fit less the safety margin, on the multiple, never above
//    the largest fit; 0 when nothing fit), and the fastest batch (best_throughput(), given).
//  - A config whose sizes or counts are below 1 is an amplab::Error.
// Why bisect: memory grows linearly with the batch, so the limit is one crossing point; doubling
// finds a bracket in log(n) trials and bisection narrows it in log(n) more (a linear scan takes n).
BatchSearch find_batch_size(const BatchStep& step, torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                            torch::Device device, const BatchFinderConfig& config, const FitsFn& fits) {
  AMPLAB_TODO("memory_optimization-2");
}

}  // namespace memory_optimization
