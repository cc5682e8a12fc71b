// GpuMonitor (gpu_monitor.hpp): the SM clock and power draw sampled on a thread while work runs.
#include "amplab/measure/gpu_monitor.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <type_traits>

#include "amplab/measure/timing.hpp"

#ifdef AMPLAB_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace amplab {

// The few NVML entry points used here, as nvml.h declares them (its header is not part of the
// CUDA toolkit's runtime packages; the library ships with the driver). Every call returns 0 on
// success.
struct GpuMonitor::Nvml {
  using Device = void*;
  int (*init)() = nullptr;                                                  // nvmlInit_v2
  int (*shutdown)() = nullptr;                                              // nvmlShutdown
  int (*handle_by_pci_bus_id)(const char*, Device*) = nullptr;              // nvmlDeviceGetHandleByPciBusId_v2
  int (*clock_info)(Device, int, unsigned*) = nullptr;                      // nvmlDeviceGetClockInfo
  int (*power_usage)(Device, unsigned*) = nullptr;                          // nvmlDeviceGetPowerUsage (mW)
  int (*clock_reasons)(Device, unsigned long long*) = nullptr;              // nvmlDeviceGetCurrentClocksThrottleReasons
  static constexpr int kClockSm = 1;                                        // NVML_CLOCK_SM
  static constexpr unsigned long long kSwPowerCap = 0x4;                    // nvmlClocksThrottleReasonSwPowerCap
  void* library = nullptr;

  ~Nvml() {
    if (shutdown) shutdown();
    if (library) dlclose(library);
  }

  // Loaded and initialised, or null.
  static std::shared_ptr<Nvml> load() {
    auto nvml = std::make_shared<Nvml>();
    nvml->library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!nvml->library) return nullptr;
    auto find = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(nvml->library, name));
      return fn != nullptr;
    };
    bool found = find(nvml->init, "nvmlInit_v2") && find(nvml->handle_by_pci_bus_id, "nvmlDeviceGetHandleByPciBusId_v2") &&
                 find(nvml->clock_info, "nvmlDeviceGetClockInfo") && find(nvml->power_usage, "nvmlDeviceGetPowerUsage") &&
                 find(nvml->clock_reasons, "nvmlDeviceGetCurrentClocksThrottleReasons");
    if (!found || nvml->init() != 0) return nullptr;  // shutdown stays unset: nothing to shut down
    find(nvml->shutdown, "nvmlShutdown");
    return nvml;
  }
};

GpuMonitor::GpuMonitor(torch::Device device, std::chrono::milliseconds period) : period_(period) {
#ifdef AMPLAB_WITH_CUDA
  if (!device.is_cuda()) return;
  // NVML numbers GPUs its own way; the PCI bus id names the same one as CUDA's index.
  char bus_id[32] = {};
  int index = device.has_index() ? device.index() : 0;
  if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), index) != cudaSuccess) {
    cudaGetLastError();  // clear it: the caller's next CUDA call must not see it
    return;
  }
  auto nvml = Nvml::load();
  if (!nvml) return;
  Nvml::Device handle = nullptr;
  if (nvml->handle_by_pci_bus_id(bus_id, &handle) != 0) return;
  nvml_ = std::move(nvml);
  handle_ = handle;
#else
  (void)device;
#endif
}

GpuMonitor::~GpuMonitor() { stop(); }

bool GpuMonitor::available() const { return nvml_ != nullptr; }

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
    unsigned long long reasons = 0;
    if (nvml_->clock_info(handle_, Nvml::kClockSm, &s.sm_mhz) == 0 && nvml_->power_usage(handle_, &s.milliwatts) == 0 &&
        nvml_->clock_reasons(handle_, &reasons) == 0) {
      s.power_capped = (reasons & Nvml::kSwPowerCap) != 0;
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
