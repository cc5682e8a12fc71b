// A profiler trace of a few training steps: what torch.profiler writes in Python, from C++ (PyTorch's
// Kineto profiler). The file opens in Perfetto (https://ui.perfetto.dev) or chrome://tracing: one
// row per host thread with PyTorch's ops, one per CUDA stream with its kernels and copies, and the
// step's phases as named ranges (amplab_step, forward, backward, optimizer: the phases the
// MemoryTracker marks, which Nsight Systems also shows as NVTX ranges).
//
//   StepTrace trace(path, /*first_step=*/10, /*steps=*/5, device);
//   for (...) { trace.before_step(step); ...the step...; trace.after_step(step); }
//
// StepTrace is train.trace_steps, fit()'s window of steps. PhaseTrace is run.trace, lab_main's:
// one trace per phase the lab names (Lab::phase), from the phase's start to its end. One profiler
// runs at a time: a step window inside a traced phase is in the phase's trace. NvtxPhases marks the same phases as NVTX
// ranges for Nsight Systems, traced or not.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace amplab {

class StepTrace {
 public:
  // Traces steps first_step .. first_step + steps - 1 (0-based, counted by the caller) into
  // `path`; an empty path traces nothing.
  StepTrace(std::string path, int64_t first_step, int64_t steps, torch::Device device);
  ~StepTrace();  // saves a trace still open (a run that ended inside the window)
  StepTrace(const StepTrace&) = delete;
  StepTrace& operator=(const StepTrace&) = delete;

  void before_step(int64_t step);
  void after_step(int64_t step);
  bool saved() const { return saved_; }
  const std::string& path() const { return path_; }

 private:
  void start();
  void finish();

  std::string path_;
  int64_t first_step_, steps_;
  torch::Device device_;
  bool running_ = false;
  bool saved_ = false;
  struct StepRange;                  // the open amplab_step range
  std::unique_ptr<StepRange> range_;
};

// Traces each phase into its own file, with the phase as a named range (its name, user
// annotation) around the lab's ranges and PyTorch's ops. Bounded three ways: a phase is traced
// only when its name contains one of `Limits::filters` (every phase when empty); its trace ends at
// the first safe point (trace_safe_point) after `Limits::seconds`, the rest of the phase running
// untraced; and no phase starts once the files written reach `Limits::budget_bytes`.
class PhaseTrace {
 public:
  // `path_of(phase, n)`: the file of the n-th phase of that name (1, 2, ...).
  using PathOf = std::function<std::string(const std::string& phase, int n)>;
  struct Limits {
    std::vector<std::string> filters;
    double seconds = 1.0;
    int64_t budget_bytes = int64_t{50} << 20;
  };
  PhaseTrace(PathOf path_of, torch::Device device, Limits limits);
  ~PhaseTrace();  // saves the phase still open (a body that threw)
  PhaseTrace(const PhaseTrace&) = delete;
  PhaseTrace& operator=(const PhaseTrace&) = delete;

  // Saves the open phase's trace and starts `name`'s ("" starts none).
  void phase(const std::string& name);
  void finish();  // saves the open phase's trace
  // Ends the open phase's trace early once it has run Limits::seconds (trace_safe_point).
  void at_safe_point();
  const std::vector<std::string>& written() const { return written_; }

 private:
  bool wanted(const std::string& name) const;
  void start(const std::string& name);
  void save(bool cut);

  PathOf path_of_;
  torch::Device device_;
  Limits limits_;
  int64_t bytes_written_ = 0;
  bool over_budget_logged_ = false;
  std::map<std::string, int> seen_;  // phases started, by name: a name marked again gets a new file
  std::string open_name_, open_path_;  // the phase being traced and its file ("" when none)
  double started_at_ = 0;              // steady-clock seconds when its trace started
  std::vector<std::string> written_;
  struct PhaseRange;
  std::unique_ptr<PhaseRange> range_;
};

// A point between steps or timed windows, on the thread that runs the lab, where run.trace may
// end a phase's trace that has run long enough (PhaseTrace::Limits::seconds): MemoryTracker::end_step
// (every Trainer step) and DeviceTimer::start call it. One load of a pointer when no phase is traced.
void trace_safe_point();

// The lab's phases as NVTX ranges (Nsight Systems' -t nvtx), one open at a time on the thread
// that marks them; without a tool attached an NVTX call costs next to nothing.
class NvtxPhases {
 public:
  NvtxPhases() = default;
  ~NvtxPhases();
  NvtxPhases(const NvtxPhases&) = delete;
  NvtxPhases& operator=(const NvtxPhases&) = delete;
  void phase(const std::string& name);  // closes the open range and opens `name`'s ("" opens none)

 private:
  bool open_ = false;
};

}  // namespace amplab
