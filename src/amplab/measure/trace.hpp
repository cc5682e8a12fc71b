// A profiler trace of a few training steps: what torch.profiler writes in Python, from C++ (PyTorch's
// Kineto profiler). The file opens in Perfetto (https://ui.perfetto.dev) or chrome://tracing: one
// row per host thread with PyTorch's ops, one per CUDA stream with its kernels and copies, and the
// step's phases as named ranges (amplab_step, forward, backward, optimizer: the phases the
// MemoryTracker marks, which Nsight Systems also shows as NVTX ranges).
//
//   StepTrace trace(path, /*first_step=*/10, /*steps=*/5, device);
//   for (...) { trace.before_step(step); ...the step...; trace.after_step(step); }
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>

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

}  // namespace amplab
