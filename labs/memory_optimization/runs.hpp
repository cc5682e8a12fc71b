// The runs behind the finder, accumulation and leak-hunt sections, given (no TODOs): your
// finder at one precision and the linear scan that checks it; a loss curve with and without
// accumulation; the leak hunt's training loop with a loss recording.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "amplab/report/results.hpp"
#include "harness.hpp"

namespace memory_optimization {

// Your finder at one precision, and the linear scan that checks it.
struct FinderResult {
  amplab::Precision precision;
  BatchSearch search;
  int64_t brute_force_limit = 0;  // 0: not checked
  std::string brute_force_note;
};

// A loss curve of the accumulation section.
struct Curve {
  std::vector<double> loss;  // per optimizer step
  double peak_mib = 0, seconds = 0;
};

// One run of the leak hunt.
struct LeakRun {
  std::vector<double> allocated_mib;  // after each step
  std::string leak_report;            // the MemoryTracker's verdict ("": no steady growth)
  double bytes_per_step = 0;          // growth from the first log point to the last step, per step
};

// Your finder at one precision; its trials go to `trials` when given.
FinderResult find_batch(Harness& h, amplab::Precision precision, amplab::ResultTable* trials);

// `steps` optimizer steps over batches of `effective` samples (the same data for every call),
// gradients computed with your accumulate_gradients in micro-batches of `micro`.
Curve train_curve(Harness& h, amplab::Precision precision, int64_t effective, int64_t micro, int64_t steps);

// Whether the effective batch fits in one step: the simulated limit on the CPU, a real try on a GPU.
std::string try_big_batch(Harness& h, amplab::Precision precision, int64_t effective);

// The leak hunt's loop from the initial parameters, each step's held-out loss going to `record` and
// `log_point` run every log_every steps; allocated memory after each step, and the tracker's report.
LeakRun run_leak_loop(Harness& h, const RecordLoss& record, const std::function<void()>& log_point);

}  // namespace memory_optimization
