// The CUDA caching allocator's history as a snapshot PyTorch's memory visualizer opens.
#include "amplab/measure/memory_snapshot.hpp"

#include "amplab/infra/files.hpp"

#ifdef AMPLAB_WITH_CUDA
#include <torch/csrc/cuda/memory_snapshot.h>
#endif

namespace amplab {

namespace {
bool recording = false;
}  // namespace

bool memory_history_recording() { return recording; }

bool start_memory_history(torch::Device device, size_t max_entries) {
#ifdef AMPLAB_WITH_CUDA
  if (!device.is_cuda()) return false;
  // Every allocation and free, without stacks: unwinding and symbolizing C++ stacks at every
  // allocation slows a training step many times over; sizes and order tell a leak apart.
  torch::cuda::_record_memory_history(std::string("all"), std::string("all"), "python", max_entries);
  recording = true;
  return true;
#else
  (void)device;
  (void)max_entries;
  return false;
#endif
}

void write_memory_snapshot(const std::string& path) {
#ifdef AMPLAB_WITH_CUDA
  if (!recording) return;
  const std::string pickled = torch::cuda::_memory_snapshot_pickled();
  torch::cuda::_record_memory_history(std::nullopt);  // stop recording
  recording = false;
  write_file_atomic(path, pickled);
#else
  (void)path;
#endif
}

}  // namespace amplab
