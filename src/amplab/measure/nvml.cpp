// NVML loaded at run time: the entry points, as nvml.h declares them; every call returns 0 on success.
#include "amplab/measure/nvml.hpp"

#include <dlfcn.h>

#include <type_traits>

#ifdef AMPLAB_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace amplab::nvml {

struct Library {
  using Device = void*;
  struct Utilization {
    unsigned gpu, memory;
  };
  struct Memory {
    unsigned long long total, free, used;
  };
  int (*init)() = nullptr;                                       // nvmlInit_v2
  int (*shutdown)() = nullptr;                                   // nvmlShutdown
  int (*handle_by_pci_bus_id)(const char*, Device*) = nullptr;   // nvmlDeviceGetHandleByPciBusId_v2
  int (*clock_info)(Device, int, unsigned*) = nullptr;           // nvmlDeviceGetClockInfo
  int (*power_usage)(Device, unsigned*) = nullptr;               // nvmlDeviceGetPowerUsage (mW)
  int (*clock_reasons)(Device, unsigned long long*) = nullptr;   // nvmlDeviceGetCurrentClocksThrottleReasons
  int (*utilization_rates)(Device, Utilization*) = nullptr;      // nvmlDeviceGetUtilizationRates
  int (*memory_info)(Device, Memory*) = nullptr;                 // nvmlDeviceGetMemoryInfo
  int (*temperature)(Device, int, unsigned*) = nullptr;          // nvmlDeviceGetTemperature
  static constexpr int kClockSm = 1;                             // NVML_CLOCK_SM
  static constexpr int kTemperatureGpu = 0;                      // NVML_TEMPERATURE_GPU
  static constexpr unsigned long long kSwPowerCap = 0x4;         // nvmlClocksThrottleReasonSwPowerCap
  void* library = nullptr;

  ~Library() {
    if (shutdown) shutdown();
    if (library) dlclose(library);
  }

  // Loaded and initialised, or null.
  static std::shared_ptr<Library> load() {
    auto nvml = std::make_shared<Library>();
    nvml->library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!nvml->library) return nullptr;
    auto find = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(nvml->library, name));
      return fn != nullptr;
    };
    bool found = find(nvml->init, "nvmlInit_v2") && find(nvml->handle_by_pci_bus_id, "nvmlDeviceGetHandleByPciBusId_v2") &&
                 find(nvml->clock_info, "nvmlDeviceGetClockInfo") && find(nvml->power_usage, "nvmlDeviceGetPowerUsage") &&
                 find(nvml->clock_reasons, "nvmlDeviceGetCurrentClocksThrottleReasons") &&
                 find(nvml->utilization_rates, "nvmlDeviceGetUtilizationRates") &&
                 find(nvml->memory_info, "nvmlDeviceGetMemoryInfo") && find(nvml->temperature, "nvmlDeviceGetTemperature");
    if (!found || nvml->init() != 0) return nullptr;  // shutdown stays unset: nothing to shut down
    find(nvml->shutdown, "nvmlShutdown");
    return nvml;
  }
};

std::unique_ptr<Gpu> Gpu::open(torch::Device device) {
#ifdef AMPLAB_WITH_CUDA
  if (!device.is_cuda()) return nullptr;
  char bus_id[32] = {};
  int index = device.has_index() ? device.index() : 0;
  if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), index) != cudaSuccess) {
    cudaGetLastError();  // clear it: the caller's next CUDA call must not see it
    return nullptr;
  }
  auto library = Library::load();
  if (!library) return nullptr;
  Library::Device handle = nullptr;
  if (library->handle_by_pci_bus_id(bus_id, &handle) != 0) return nullptr;
  return std::unique_ptr<Gpu>(new Gpu(std::move(library), handle));
#else
  (void)device;
  return nullptr;
#endif
}

Gpu::~Gpu() = default;

bool Gpu::sm_clock_mhz(unsigned& mhz) const { return library_->clock_info(handle_, Library::kClockSm, &mhz) == 0; }

bool Gpu::power_milliwatts(unsigned& milliwatts) const { return library_->power_usage(handle_, &milliwatts) == 0; }

bool Gpu::power_capped(bool& capped) const {
  unsigned long long reasons = 0;
  if (library_->clock_reasons(handle_, &reasons) != 0) return false;
  capped = (reasons & Library::kSwPowerCap) != 0;
  return true;
}

bool Gpu::utilization(unsigned& sm_percent, unsigned& memory_percent) const {
  Library::Utilization u{};
  if (library_->utilization_rates(handle_, &u) != 0) return false;
  sm_percent = u.gpu;
  memory_percent = u.memory;
  return true;
}

bool Gpu::memory_used_bytes(unsigned long long& used) const {
  Library::Memory m{};
  if (library_->memory_info(handle_, &m) != 0) return false;
  used = m.used;
  return true;
}

bool Gpu::temperature_c(unsigned& celsius) const {
  return library_->temperature(handle_, Library::kTemperatureGpu, &celsius) == 0;
}

}  // namespace amplab::nvml
