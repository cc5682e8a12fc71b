// A profiler trace of a few training steps: what torch.profiler writes in Python, from C++ (PyTorch's
// Kineto profiler). The file opens in Perfetto (https://ui.perfetto.dev) or chrome://tracing: one
// row per host thread with PyTorch's ops, one per CUDA stream with its kernels and copies, and the
// step's phases as named ranges (amplab_step, forward, backward, optimizer: the phases the
// MemoryTracker marks, which Nsight Systems also shows as NVTX ranges).
//
//   StepTrace trace(path, /*first_step=*/10, /*steps=*/5, device);
//   for (...) { trace.before_step(step); ...the step...; trace.after_step(step); }
//
// PhaseTrace is run.trace in a lab that does not train through fit(): one trace per phase the lab
// names (Lab::phase), from the phase's start to its end. NvtxPhases marks the same phases as NVTX
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
// annotation) around the lab's ranges and PyTorch's ops. Kineto cannot stop a trace part-way
// through a phase, so the bound is on phases: a phase is traced only when its name contains one of
// `filters` (every phase when empty), and no phase starts once the files written reach
// `budget_bytes` (a phase that started under it is traced to its end).
class PhaseTrace {
 public:
  // `path_of(phase, n)`: the file of the n-th phase of that name (1, 2, ...).
  using PathOf = std::function<std::string(const std::string& phase, int n)>;
  PhaseTrace(PathOf path_of, torch::Device device, std::vector<std::string> filters, int64_t budget_bytes);
  ~PhaseTrace();  // saves the phase still open (a body that threw)
  PhaseTrace(const PhaseTrace&) = delete;
  PhaseTrace& operator=(const PhaseTrace&) = delete;

  // Saves the open phase's trace and starts `name`'s ("" starts none).
  void phase(const std::string& name);
  void finish();  // saves the open phase's trace
  const std::vector<std::string>& written() const { return written_; }

 private:
  bool wanted(const std::string& name) const;
  void start(const std::string& name);

  PathOf path_of_;
  torch::Device device_;
  std::vector<std::string> filters_;
  int64_t budget_bytes_, bytes_written_ = 0;
  bool over_budget_logged_ = false;
  std::map<std::string, int> seen_;  // phases started, by name: a name marked again gets a new file
  std::string open_path_;            // the trace being recorded ("" when none)
  std::vector<std::string> written_;
  struct PhaseRange;
  std::unique_ptr<PhaseRange> range_;
};

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
