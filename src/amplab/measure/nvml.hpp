// NVML, the driver's management library, loaded at run time (dlopen): the few entry points the
// GPU monitor and the utilization timeline read. Nothing here needs nvml.h or links the library:
// it ships with the driver, and a machine without one simply has no readings.
#pragma once

#include <torch/types.h>

#include <memory>

namespace amplab::nvml {

struct Library;  // the loaded library and its entry points (nvml.cpp)

// One GPU, found by the PCI bus id of CUDA's device (NVML numbers GPUs its own way).
class Gpu {
 public:
  // Null when `device` is not CUDA, the build has no CUDA, or NVML or the GPU cannot be found.
  static std::unique_ptr<Gpu> open(torch::Device device);
  ~Gpu();

  // Each returns false when the reading failed (the value is then left as it was).
  bool sm_clock_mhz(unsigned& mhz) const;
  bool power_milliwatts(unsigned& milliwatts) const;
  bool power_capped(bool& capped) const;                    // the power cap is lowering the clock now
  bool utilization(unsigned& sm_percent, unsigned& memory_percent) const;  // over the driver's last sample window
  bool memory_used_bytes(unsigned long long& used) const;
  bool temperature_c(unsigned& celsius) const;

 private:
  Gpu(std::shared_ptr<Library> library, void* handle) : library_(std::move(library)), handle_(handle) {}
  std::shared_ptr<Library> library_;
  void* handle_;  // nvmlDevice_t
};

}  // namespace amplab::nvml
