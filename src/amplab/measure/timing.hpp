// Timing that is right on a GPU: kernels run asynchronously, so a host clock read after launching
// measures the launch, not the work. CUDA events (or a synchronize) bracket the work itself.
#pragma once

#include <torch/types.h>

#include <chrono>
#include <functional>
#include <vector>

#include "amplab/measure/trace.hpp"

namespace amplab {

// Order statistics of repeated measurements. Quantiles interpolate linearly between the closest
// ranks, as numpy.percentile and torch.quantile do by default.
struct Summary {
  size_t count = 0;
  double median = 0;
  double q1 = 0;   // 25th percentile
  double q3 = 0;   // 75th percentile
  double iqr = 0;  // q3 - q1
  double mean = 0;
  double min = 0;
  double max = 0;
};
Summary summarize(std::vector<double> samples);
double quantile(std::vector<double> samples, double q);  // q in [0, 1]

// Host wall clock.
class Stopwatch {
 public:
  Stopwatch() : start_(Clock::now()) {}
  void restart() { start_ = Clock::now(); }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  double milliseconds() const { return seconds() * 1e3; }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_;
};

// Points in a stream of device work (CUDA events on a GPU, the host clock on the CPU), for
// splitting a step into phases: mark(0) before the first phase, mark(k) at each boundary, then
// intervals_ms() waits for the work and returns the time between consecutive marks.
class DeviceMarks {
 public:
  DeviceMarks(torch::Device device, size_t count);
  ~DeviceMarks();
  DeviceMarks(const DeviceMarks&) = delete;
  DeviceMarks& operator=(const DeviceMarks&) = delete;
  void mark(size_t index);
  std::vector<double> intervals_ms();  // count - 1 values: mark k to mark k + 1

 private:
  torch::Device device_;
  std::vector<double> host_ms_;
  Stopwatch host_;
  struct Events;
  std::unique_ptr<Events> events_;
};

// Brackets work on one device: CUDA events on the current stream of a GPU, the host clock
// (after a synchronize) on the CPU. start(); ...queue work...; double ms = stop_ms();
class DeviceTimer {
 public:
  explicit DeviceTimer(torch::Device device) : marks_(device, 2) {}
  void start() {
    trace_safe_point();  // run.trace may end a long phase's trace here, outside the timed work
    marks_.mark(0);
  }
  double stop_ms() {  // waits for the work queued since start() and returns its duration
    marks_.mark(1);
    return marks_.intervals_ms()[0];
  }

 private:
  DeviceMarks marks_;
};

// Runs `work` `repeats` times back to back, without waiting for the device between them (as a
// training loop does), `windows` times; the milliseconds per run of each window.
std::vector<double> time_back_to_back(const std::function<void()>& work, torch::Device device, int repeats,
                                      int windows);

}  // namespace amplab
