// GpuMonitor (gpu_monitor.hpp): the SM clock and power draw sampled on a thread while work runs.
#include "amplab/measure/gpu_monitor.hpp"

#include <algorithm>

#include "amplab/measure/timing.hpp"

namespace amplab {

GpuMonitor::GpuMonitor(torch::Device device, std::chrono::milliseconds period)
    : period_(period), gpu_(nvml::Gpu::open(device)) {}

GpuMonitor::~GpuMonitor() { stop(); }

bool GpuMonitor::available() const { return gpu_ != nullptr; }

void GpuMonitor::start() {
  stop();
  if (!available()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    samples_.clear();
  }
  running_ = true;
  thread_ = std::thread([this] { sample_until_stopped(); });
}

void GpuMonitor::sample_until_stopped() {
  while (running_) {
    Sample s{};
    if (gpu_->sm_clock_mhz(s.sm_mhz) && gpu_->power_milliwatts(s.milliwatts) && gpu_->power_capped(s.power_capped)) {
      std::lock_guard<std::mutex> lock(mutex_);
      samples_.push_back(s);
    }
    std::this_thread::sleep_for(period_);
  }
}

std::optional<GpuReading> GpuMonitor::stop() {
  if (thread_.joinable()) {
    running_ = false;
    thread_.join();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (samples_.empty()) return std::nullopt;
  auto median = [&](auto field) {
    std::vector<double> values;
    for (const auto& s : samples_) values.push_back(static_cast<double>(field(s)));
    return quantile(std::move(values), 0.5);
  };
  GpuReading reading;
  reading.samples = samples_.size();
  reading.sm_mhz = median([](const Sample& s) { return s.sm_mhz; });
  reading.watts = median([](const Sample& s) { return s.milliwatts; }) / 1e3;
  reading.power_capped = static_cast<double>(std::count_if(samples_.begin(), samples_.end(),
                                                           [](const Sample& s) { return s.power_capped; })) /
                         static_cast<double>(samples_.size());
  samples_.clear();
  return reading;
}

}  // namespace amplab
