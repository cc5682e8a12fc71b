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
  // BEGIN SOLUTION
  BatchTrial trial;
  trial.batch = batch;
  if (fits && !fits(batch)) {
    trial.error = "over the memory limit (injected check)";
    return trial;
  }
  trial.ran = true;
  const int warmup = config.trial_steps > 1 ? 1 : 0;
  Measurement m = measure([&] { step(batch); }, device, warmup, static_cast<int>(config.trial_steps) - warmup);
  trial.fits = m.fits;
  trial.error = m.error;
  trial.peak_allocated_mib = m.peak_allocated_mib;
  trial.peak_reserved_mib = m.peak_reserved_mib;
  trial.step_ms = m.step_ms;
  if (m.fits && m.step_ms > 0) trial.samples_per_second = static_cast<double>(batch) / (m.step_ms / 1e3);
  if (!m.fits) {
    model.zero_grad(/*set_to_none=*/true);  // gradients half written by the failed backward
    amplab::free_cached_memory(device);     // now their blocks can go back to the driver
  }
  return trial;
  // END SOLUTION
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
  // BEGIN SOLUTION
  if (config.start < 1 || config.multiple_of < 1 || config.max_batch < 1 || config.trial_steps < 1)
    throw amplab::Error("find_batch_size: start, multiple_of, max_batch and trial_steps must be at least 1");
  BatchSearch search;
  const int64_t m = config.multiple_of;
  const int64_t max_batch = round_down_to(config.max_batch, m);
  TrainingSnapshot snapshot(model, optimizer);
  auto attempt = [&](int64_t batch) {
    search.trials.push_back(try_batch(step, model, device, batch, config, fits));
    snapshot.restore();
    return search.trials.back().fits;
  };
  try {
    int64_t lo = 0, hi = 0;  // the largest batch that fit, the first that did not (0: none yet)
    int64_t batch = std::min((config.start + m - 1) / m * m, max_batch);
    while (true) {
      if (!attempt(batch)) {
        hi = batch;
        break;
      }
      lo = batch;
      if (batch >= max_batch) break;
      batch = std::min(2 * batch, max_batch);
    }
    while (hi > 0 && hi - lo > m) {
      int64_t mid = std::max(lo + m, (lo + (hi - lo) / 2) / m * m);
      if (mid >= hi) break;
      (attempt(mid) ? lo : hi) = mid;
    }
    search.largest_fit = lo;
    search.smallest_oom = hi;
  } catch (...) {
    snapshot.restore();
    throw;
  }
  if (search.largest_fit > 0) {
    auto with_margin = static_cast<int64_t>(std::floor(static_cast<double>(search.largest_fit) * (1.0 - config.safety_margin)));
    search.recommended = std::min(search.largest_fit, round_down_to(with_margin, m));
  }
  std::tie(search.best_throughput, search.best_samples_per_second) = best_throughput(search.trials);
  return search;
  // END SOLUTION
}

}  // namespace memory_optimization
