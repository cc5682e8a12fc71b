// Memory per phase of a training step. On a GPU: the CUDA caching allocator's counters
// (allocated = bytes held by live tensors, reserved = bytes the allocator holds from the driver,
// their peaks, allocation retries and OOMs). On the CPU: the process's resident set size (RSS)
// and its high-water mark, marked as such because they also count the allocator's free lists
// and everything else in the process.
#pragma once

#include <torch/types.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "amplab/infra/config.hpp"

namespace amplab {

enum class Phase { forward, backward, optimizer, other };
const char* to_string(Phase phase);

struct MemoryConfig {
  bool track = true;
  bool timeline = true;
  int64_t leak_window = 50;
  double leak_min_mib = 1.0;

  template <class V>
  void fields(V& v) {
    v.field("track", track, "measure memory per phase of each step (host-side counters: no device sync)");
    v.field("timeline", timeline, "keep a per-phase timeline (memory_timeline.csv)");
    v.field("leak_window", leak_window, "steps over which steady growth of allocated memory is reported as a leak",
            Range<int64_t>::at_least(2));
    v.field("leak_min_mib", leak_min_mib, "growth below this (MiB) over the window is ignored", Range<double>::at_least(0));
  }
};

// One reading of the counters.
struct MemoryReading {
  int64_t allocated = 0;       // bytes (CPU: RSS)
  int64_t reserved = 0;        // bytes (CPU: RSS)
  int64_t peak_allocated = 0;  // bytes since the last peak reset (CPU: RSS high-water mark)
  int64_t peak_reserved = 0;
  int64_t alloc_retries = 0;   // cudaMalloc retries after freeing cached blocks (CPU: 0)
  int64_t ooms = 0;            // out-of-memory errors the allocator raised (CPU: 0)
};

MemoryReading read_memory(torch::Device device);
void reset_peak_memory(torch::Device device);  // GPU: allocator peaks; CPU: the RSS high-water mark
bool memory_is_rss(torch::Device device);      // true on the CPU

// One row of the timeline: the state at the end of a phase, or inside it (MemoryTracker::sample).
struct PhaseSample {
  int64_t step = 0;
  Phase phase = Phase::other;
  double seconds = 0;  // since the tracker started (host clock)
  MemoryReading reading;
  bool phase_end = true;  // false: a sample taken inside the phase
};

class MemoryTracker {
 public:
  MemoryTracker(torch::Device device, const MemoryConfig& config);

  // Marks the start of a phase: closes the previous one, resets the peak counters (so each
  // phase's peak is its own) and opens an NVTX range named after the phase (CUDA builds), so
  // that Nsight Systems shows forward/backward/optimizer.
  void begin(Phase phase);
  // Closes the open phase and records step-end memory (used for leak detection).
  void end_step(int64_t step);
  // Adds a timeline sample inside the open phase without closing it (e.g. after each layer), so
  // that the timeline shows memory rise through the forward pass and fall through backward.
  void sample();

  // The largest peak seen in each phase, in bytes.
  int64_t phase_peak(Phase phase) const { return phase_peak_[static_cast<int>(phase)]; }
  const std::vector<PhaseSample>& timeline() const { return timeline_; }
  // When allocated memory at step end has grown steadily over the last leak_window steps,
  // a one-line description naming the phase that grows most; "" otherwise.
  std::string leak_report() const;

  void write_timeline_csv(const std::string& path) const;
  std::string summary_table() const;  // peaks per phase, current, reserved, retries, OOMs
  torch::Device device() const { return device_; }
  bool enabled() const { return config_.track; }

 private:
  void close_phase();

  torch::Device device_;
  MemoryConfig config_;
  bool phase_open_ = false;
  struct PhaseRange;                  // the open phase as a profiler range (StepTrace shows it)
  std::shared_ptr<PhaseRange> range_;
  Phase current_ = Phase::other;
  int64_t step_ = 0;
  double start_seconds_;
  std::array<int64_t, 4> phase_peak_{};
  std::vector<PhaseSample> timeline_;
  std::array<int64_t, 4> phase_end_allocated_{};            // allocated at the end of each phase, this step
  std::vector<std::array<int64_t, 4>> step_end_by_phase_;  // the same, per finished step
  std::vector<int64_t> step_end_allocated_;
};

// For an out-of-memory error: what was asked for, what is in use, and what to try.
std::string explain_oom(const std::string& torch_message, torch::Device device, Phase phase);

// True for an out-of-memory error: c10::OutOfMemoryError (the caching allocator), or a cuBLAS or
// cuDNN workspace allocation that failed (reported as a plain c10::Error).
bool is_out_of_memory(const std::exception& error);
// The first line of an out-of-memory message (torch's run on over several lines of advice).
std::string oom_summary(const std::exception& error);

// Returns the caching allocator's cached, unused blocks to the driver (after an out-of-memory
// error, before measuring reserved memory afresh). A no-op on the CPU.
void free_cached_memory(torch::Device device);

// Caps what the CUDA caching allocator may reserve on `device` at `bytes` (0: lifts the cap), via
// setMemoryFraction: allocations beyond it raise c10::OutOfMemoryError as a full GPU would. Lets a
// large GPU behave like a small one (a 4 GiB cap on a 140 GB H200). Throws amplab::Error on the
// CPU or when `bytes` exceeds the device's memory.
void limit_device_memory(torch::Device device, int64_t bytes);
// Total memory of a GPU in bytes (0 on the CPU).
int64_t device_total_memory(torch::Device device);

}  // namespace amplab
