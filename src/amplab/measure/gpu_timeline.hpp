// The GPU through a whole run: SM utilization, memory used, power, SM clock and temperature,
// sampled about 20 times a second by a thread of its own, appended to gpu_monitor.csv as they
// come, and summed up per phase (what the lab was doing then: "gpu-amp", "bf16-mixed mlp").
//
// Utilization is NVML's: the share of the driver's last sample window (1/6 s to 1 s, by GPU) in
// which at least one kernel ran. 100% says the GPU was never idle, not that its SMs were full:
// one small kernel at a time also reads 100%. Idle gaps (the host preparing the next step, a
// synchronization, the data loader) are what lower it.
#pragma once

#include <torch/types.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "amplab/measure/nvml.hpp"

namespace amplab {

class AppendFile;

// What one phase of a run looked like on the GPU.
struct GpuPhaseStats {
  std::string phase;
  double seconds = 0;
  int64_t samples = 0;
  double sm_util_mean_pct = 0;
  double memory_used_max_mib = 0;
  double power_mean_w = 0;
  double sm_clock_mean_mhz = 0;
  double temperature_max_c = 0;
};

class GpuTimeline {
 public:
  // Starts sampling `device` every `period`, appending rows to `csv_path` ("": no file). On a CPU
  // device, or without NVML, nothing is sampled and available() is false.
  GpuTimeline(torch::Device device, const std::string& csv_path,
              std::chrono::milliseconds period = std::chrono::milliseconds(50));
  ~GpuTimeline();
  GpuTimeline(const GpuTimeline&) = delete;
  GpuTimeline& operator=(const GpuTimeline&) = delete;

  bool available() const { return gpu_ != nullptr; }
  void phase(const std::string& name);  // labels the samples from now on ("" at the start)
  void stop();                          // ends sampling (idempotent)
  // Each phase with samples, in the order they began.
  std::vector<GpuPhaseStats> phases() const;
  std::optional<GpuPhaseStats> phase_stats(const std::string& name) const;
  nlohmann::json summary() const;  // phases() as a list of objects, for summary.json

 private:
  struct Sample {
    double t = 0;  // seconds since the start
    unsigned sm_util = 0, memory_util = 0, sm_mhz = 0, milliwatts = 0, celsius = 0;
    unsigned long long memory_used = 0;
    size_t phase = 0;  // index into phase_names_
  };
  void sample_until_stopped();
  Sample read(double t, size_t phase) const;

  std::unique_ptr<nvml::Gpu> gpu_;
  std::unique_ptr<AppendFile> csv_;
  std::chrono::milliseconds period_;
  std::chrono::steady_clock::time_point start_;
  mutable std::mutex mutex_;
  std::vector<std::string> phase_names_{""};
  size_t current_phase_ = 0;
  std::vector<Sample> samples_;
  std::atomic<bool> running_{false};
  std::thread thread_;
};

}  // namespace amplab
