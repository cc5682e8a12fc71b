// Precisions (precision.hpp): names, autocast dtypes, device support, the autocast and TF32 guards.
#include "amplab/train/precision.hpp"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <torch/cuda.h>

#ifdef AMPLAB_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include "amplab/infra/error.hpp"

namespace amplab {

std::string to_string(Precision precision) {
  for (const auto& [p, name] : kPrecisionNames)
    if (p == precision) return name;
  return "?";
}

c10::ScalarType autocast_dtype(Precision precision) {
  switch (precision) {
    case Precision::fp16_mixed: return c10::ScalarType::Half;
    case Precision::bf16_mixed: return c10::ScalarType::BFloat16;
    default: return c10::ScalarType::Float;
  }
}

bool is_supported(Precision precision, c10::Device device, std::string* why) {
  auto refuse = [&](const std::string& reason) {
    if (why) *why = reason;
    return false;
  };
  if (device.is_cpu()) {
    if (precision == Precision::tf32) return refuse("tf32 needs an NVIDIA GPU (Ampere or newer); on the CPU use fp32 or bf16-mixed");
    if (precision == Precision::fp16_mixed)
      return refuse("fp16-mixed needs a GPU (CPU autocast runs bf16); on the CPU use fp32 or bf16-mixed");
    return true;
  }
  if (device.is_cuda() && !torch::cuda::is_available())
    return refuse(to_string(precision) + " on " + device.str() +
                  ": no CUDA device is available here; run on a GPU machine or use the cpu device");
#ifdef AMPLAB_WITH_CUDA
  if (device.is_cuda() && (precision == Precision::bf16_mixed || precision == Precision::tf32)) {
    const auto* props = at::cuda::getDeviceProperties(device.has_index() ? device.index() : 0);
    if (props->major < 8)
      return refuse(to_string(precision) + " needs compute capability 8.0 or newer; this GPU has " +
                    std::to_string(props->major) + "." + std::to_string(props->minor) + "; use fp16-mixed or fp32");
  }
#endif
  return true;
}

void check_supported(Precision precision, c10::Device device) {
  std::string why;
  if (!is_supported(precision, device, &why)) throw Error("train.precision: " + why);
}

AutocastGuard::AutocastGuard(c10::DeviceType device_type, c10::ScalarType dtype, bool enabled, bool cache_enabled)
    : device_type_(device_type),
      previous_enabled_(at::autocast::is_autocast_enabled(device_type)),
      previous_dtype_(at::autocast::get_autocast_dtype(device_type)),
      previous_cache_enabled_(at::autocast::is_autocast_cache_enabled()) {
  at::autocast::set_autocast_enabled(device_type, enabled);
  at::autocast::set_autocast_dtype(device_type, dtype);
  at::autocast::increment_nesting();
  at::autocast::set_autocast_cache_enabled(cache_enabled);
}

AutocastGuard::AutocastGuard(c10::Device device, Precision precision)
    : AutocastGuard(device.type(), is_mixed(precision) ? autocast_dtype(precision)
                                                       : at::autocast::get_autocast_dtype(device.type()),
                    is_mixed(precision), at::autocast::is_autocast_cache_enabled()) {}

AutocastGuard::~AutocastGuard() {
  // Cached casts of weights are only valid inside the outermost autocast region.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_type_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
  at::autocast::set_autocast_cache_enabled(previous_cache_enabled_);
}

Tf32Guard::Tf32Guard(bool allow)
    : previous_cublas_(at::globalContext().allowTF32CuBLAS()), previous_cudnn_(at::globalContext().allowTF32CuDNN()) {
  at::globalContext().setAllowTF32CuBLAS(allow);
  at::globalContext().setAllowTF32CuDNN(allow);
}

Tf32Guard::~Tf32Guard() {
  at::globalContext().setAllowTF32CuBLAS(previous_cublas_);
  at::globalContext().setAllowTF32CuDNN(previous_cudnn_);
}

}  // namespace amplab
