// Devices (device.hpp): resolving "auto|cpu|cuda|cuda:N", checking a model's, synchronizing.
#include "amplab/infra/device.hpp"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <torch/cuda.h>

#ifdef AMPLAB_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <charconv>

#include "amplab/infra/env.hpp"
#include "amplab/infra/error.hpp"

namespace amplab {

bool cuda_available() { return torch::cuda::is_available(); }

int cuda_device_count() { return cuda_available() ? static_cast<int>(torch::cuda::device_count()) : 0; }

torch::Device resolve_device(const std::string& spec) {
  if (spec == "cpu") return torch::kCPU;
  if (spec == "auto") return cuda_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  if (spec == "cuda" || spec.rfind("cuda:", 0) == 0) {
    int index = 0;
    if (spec.size() > 4) {
      const char* first = spec.data() + 5;
      const char* last = spec.data() + spec.size();
      auto [end, ec] = std::from_chars(first, last, index);
      if (ec != std::errc() || end != last || index < 0 || first == last)
        throw Error("device '" + spec + "' is not valid; use auto, cpu, cuda or cuda:N (N = 0, 1, ...)");
    }
    if (!cuda_available())
      throw Error("device '" + spec +
                  "' was asked for but no CUDA device is available here; run with --set run.device=cpu "
                  "(or auto) or on a GPU machine");
    int count = cuda_device_count();
    if (index >= count)
      throw Error("device '" + spec + "' does not exist: this machine has " + std::to_string(count) +
                  " CUDA device(s), cuda:0 to cuda:" + std::to_string(count - 1));
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  throw Error("device '" + spec + "' is not valid; use auto, cpu, cuda or cuda:N (N = 0, 1, ...)");
}

void check_on_device(const torch::nn::Module& module, torch::Device device) {
  // "cuda" without an index accepts any GPU; "cuda:1" only that one.
  auto same = [&](const torch::Tensor& t) {
    return t.device().type() == device.type() && (!device.has_index() || t.device().index() == device.index());
  };
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (!same(item.value()))
      throw Error("parameter '" + item.key() + "' is on " + item.value().device().str() + ", expected " +
                  device.str() + "; move the model with model->to(device) before creating the optimizer");
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    if (!same(item.value()))
      throw Error("buffer '" + item.key() + "' is on " + item.value().device().str() + ", expected " +
                  device.str() + "; move the model with model->to(device)");
  }
}

std::string describe(torch::Device device) {
#ifdef AMPLAB_WITH_CUDA
  if (device.is_cuda()) {
    const auto* props = at::cuda::getDeviceProperties(device.has_index() ? device.index() : 0);
    char memory[32];
    std::snprintf(memory, sizeof memory, "%.1f GiB", static_cast<double>(props->totalGlobalMem) / (1 << 30));
    return device.str() + " (" + props->name + ", " + memory + ")";
  }
#endif
  return device.str() + " (" + cpu_model_name() + ", " + std::to_string(at::get_num_threads()) + " threads)";
}

void synchronize(torch::Device device) {
#ifdef AMPLAB_WITH_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#endif
}

}  // namespace amplab
