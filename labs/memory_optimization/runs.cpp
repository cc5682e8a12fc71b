// The runs behind the finder, accumulation and leak-hunt sections (runs.hpp).
#include "runs.hpp"

#include <algorithm>

#include "amplab/infra/device.hpp"
#include "amplab/infra/log.hpp"
#include "amplab/measure/memory.hpp"
#include "amplab/measure/timing.hpp"
#include "given/training_snapshot.hpp"

namespace memory_optimization {

using amplab::Precision;

namespace {

void add_trial(amplab::ResultTable* trials, Precision precision, const std::string& phase, const BatchTrial& t) {
  if (trials)
    trials->add({amplab::to_string(precision), phase, t.batch, t.fits, !t.ran, t.step_ms, t.samples_per_second,
                 t.peak_allocated_mib, t.peak_reserved_mib, t.error});
}

// The finder's check: a linear scan from a fraction of its answer up to the first batch that fails.
void scan_linearly(Harness& h, const BatchStep& step, amplab::Trainer& trainer, const FitsFn& fits,
                   FinderResult& r, amplab::ResultTable* trials) {
  const auto& c = h.mem.finder;
  TrainingSnapshot snapshot(*h.model, &trainer.optimizer());
  const int64_t m = c.brute_force_step;
  int64_t batch = round_down_to(static_cast<int64_t>(static_cast<double>(r.search.largest_fit) * c.brute_force_from), m);
  // Up to twice the finder's first OOM at most: a scan that gets there without failing has
  // shown the finder wrong already.
  const int64_t scan_max = std::min(c.search.max_batch, 2 * std::max(r.search.smallest_oom, r.search.largest_fit));
  amplab::log::info("brute force: " + amplab::to_string(r.precision) + " from batch " + std::to_string(batch) +
                    " in steps of " + std::to_string(m));
  int scanned = 0;
  bool hit_oom = false;
  for (; batch <= scan_max && !hit_oom; batch += m, ++scanned) {
    BatchTrial t = try_batch(step, *h.model, h.device, batch, c.search, fits);
    snapshot.restore();
    add_trial(trials, r.precision, "brute_force", t);
    hit_oom = !t.fits;
    if (t.fits) r.brute_force_limit = batch;
  }
  r.brute_force_note = std::to_string(scanned) + " batches scanned in steps of " + std::to_string(m);
  if (!hit_oom) r.brute_force_note += "; stopped at " + std::to_string(scan_max) + " without an OOM";
  if (r.brute_force_limit == 0) r.brute_force_note += "; the scan's first batch did not fit (memory not monotonic in batch?)";
}

}  // namespace

FinderResult find_batch(Harness& h, Precision precision, amplab::ResultTable* trials) {
  FinderResult result{precision, {}, 0, ""};
  h.reset(0);
  amplab::Trainer trainer = h.trainer(precision);
  BatchStep step = [&](int64_t batch) { trainer.step(make_batch(batch, h.teacher, h.device)); };
  auto fits = h.simulated_fits(precision, 0);
  amplab::log::info("finder: " + amplab::to_string(precision));
  result.search = find_batch_size(step, *h.model, &trainer.optimizer(), h.device, h.mem.finder.search, fits);
  for (const auto& t : result.search.trials) add_trial(trials, precision, "search", t);
  if (h.mem.finder.brute_force && result.search.largest_fit > 0) scan_linearly(h, step, trainer, fits, result, trials);
  h.release();
  return result;
}

Curve train_curve(Harness& h, Precision precision, int64_t effective, int64_t micro, int64_t steps) {
  h.reset(0);
  Curve curve;
  amplab::Trainer trainer = h.trainer(precision);
  std::vector<torch::Tensor> losses;
  amplab::free_cached_memory(h.device);
  amplab::reset_peak_memory(h.device);
  amplab::synchronize(h.device);
  amplab::Stopwatch clock;
  for (int64_t s = 0; s < steps; ++s) {
    torch::manual_seed(static_cast<uint64_t>(h.config.run.seed) + 1000 + static_cast<uint64_t>(s));  // same data in both runs
    amplab::Batch batch = make_batch(effective, h.teacher, h.device);
    losses.push_back(trainer.step(split_batch(batch, micro)).loss);  // your accumulate_gradients when micro < effective
  }
  amplab::synchronize(h.device);
  curve.seconds = clock.seconds();
  curve.peak_mib = mib(amplab::read_memory(h.device).peak_allocated);
  for (const auto& l : losses) curve.loss.push_back(l.item<double>());
  h.model->zero_grad(/*set_to_none=*/true);
  return curve;
}

std::string try_big_batch(Harness& h, Precision precision, int64_t effective) {
  if (auto fits = h.simulated_fits(precision, 0)) return fits(effective) ? "fits (simulated)" : "does not fit (simulated limit)";
  amplab::log::info("accumulation: trying the big batch " + std::to_string(effective) + " in one step");
  Measurement m = run_setting(h, precision, 0, effective);
  return m.fits ? "fits" : "does not fit: " + m.error;
}

LeakRun run_leak_loop(Harness& h, const RecordLoss& record, const std::function<void()>& log_point) {
  const auto& c = h.mem.leak;
  h.reset(0);
  LeakRun run;
  {
    torch::optim::SGD sgd(h.model->parameters(), torch::optim::SGDOptions(0.01));
    torch::manual_seed(static_cast<uint64_t>(h.config.run.seed) + 2000);  // the same data in both runs
    amplab::Batch held_out = make_batch(c.held_out, h.teacher, h.device);
    amplab::MemoryConfig memory;
    memory.timeline = false;
    memory.leak_window = c.steps;
    amplab::MemoryTracker tracker(h.device, memory);
    train_with_history(h.model, sgd, h.teacher, held_out, c.batch, c.steps, record, [&](int64_t step) {
      if ((step + 1) % c.log_every == 0) log_point();
      run.allocated_mib.push_back(mib(amplab::read_memory(h.device).allocated));
    }, &tracker);
    run.leak_report = tracker.leak_report();
  }
  const size_t first = static_cast<size_t>(std::min(c.log_every, c.steps)) - 1;
  if (run.allocated_mib.size() > first + 1)
    run.bytes_per_step = (run.allocated_mib.back() - run.allocated_mib[first]) * (1 << 20) /
                         static_cast<double>(run.allocated_mib.size() - 1 - first);
  return run;
}

}  // namespace memory_optimization
