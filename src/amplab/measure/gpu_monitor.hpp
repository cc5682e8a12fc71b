// What the GPU runs at while work is timed: its SM clock, its power draw, and whether the power
// cap is what holds the clock down. A big bf16 matmul on an H200 draws the card's whole power
// limit, so the clock falls below its maximum to stay under it; anything else the GPU does at the
// same time (an all-reduce moving gradients, say) takes power from the matmuls, which then run
// at a lower clock. Reading the clock beside a timing tells "slower because of contention for
// power" from "slower because of contention for the SMs".
//
//   GpuMonitor monitor(device);
//   monitor.start();
//   ...timed work...
//   if (auto reading = monitor.stop()) std::cout << reading->sm_mhz << " MHz\n";
//
// Samples come from NVML, the driver's management library, loaded when the monitor starts:
// nothing on a CPU device or where there is no NVIDIA driver (stop() then returns nothing).
#pragma once

#include <torch/types.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "amplab/measure/nvml.hpp"

namespace amplab {

struct GpuReading {
  double sm_mhz = 0;          // median SM clock over the samples
  double watts = 0;           // median power draw (NVML's figure, which the driver averages)
  double power_capped = 0;    // fraction of the samples where the power cap was lowering the clock
  size_t samples = 0;
};

class GpuMonitor {
 public:
  explicit GpuMonitor(torch::Device device, std::chrono::milliseconds period = std::chrono::milliseconds(10));
  ~GpuMonitor();
  GpuMonitor(const GpuMonitor&) = delete;
  GpuMonitor& operator=(const GpuMonitor&) = delete;

  bool available() const;  // NVML loaded and the device found
  void start();            // begins sampling on a thread of its own (drops earlier samples)
  std::optional<GpuReading> stop();  // ends sampling; nothing when unavailable or no sample was taken

 private:
  struct Sample {
    unsigned sm_mhz;
    unsigned milliwatts;
    bool power_capped;
  };
  void sample_until_stopped();

  std::chrono::milliseconds period_;
  std::unique_ptr<nvml::Gpu> gpu_;  // null when unavailable
  std::thread thread_;
  std::atomic<bool> running_{false};
  std::mutex mutex_;
  std::vector<Sample> samples_;
};

}  // namespace amplab
