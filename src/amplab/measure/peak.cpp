// The ceilings a step's TFLOP/s are compared with (peak.hpp).
#include "amplab/measure/peak.hpp"

#include <ATen/ATen.h>
#ifdef AMPLAB_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime_api.h>
#endif
#include <torch/torch.h>

#include "amplab/measure/timing.hpp"

namespace amplab {

double bf16_matmul_tflops(int64_t n, torch::Device device, int warmup, int repeats, int windows) {
  torch::NoGradGuard no_grad;
  auto options = torch::TensorOptions().dtype(torch::kBFloat16).device(device);
  torch::Tensor a = torch::randn({n, n}, options), b = torch::randn({n, n}, options), c = torch::empty({n, n}, options);
  for (int i = 0; i < warmup; ++i) at::mm_out(c, a, b);
  auto ms = time_back_to_back([&] { at::mm_out(c, a, b); }, device, repeats, windows);  // ms per matmul
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / (summarize(ms).median * 1e9);
}

TensorCorePeak tensor_core_peak(torch::Device device) {
  TensorCorePeak peak;
#ifdef AMPLAB_WITH_CUDA
  if (!device.is_cuda()) return peak;
  int index = device.has_index() ? device.index() : 0;
  const auto* props = at::cuda::getDeviceProperties(index);
  // Dense bf16 FLOP per clock per SM, from NVIDIA's datasheets divided by SMs x the clock they
  // are rated at: A100 312 TFLOP/s = 108 x 1.41 GHz x 2048; H100 SXM/H200 989.4 = 132 x 1.83 GHz
  // x 4096 (their highest clock is 1.98 GHz, so the bound below is 1070.5 there); B200 8192.
  if (props->major == 8 && props->minor == 0) peak.flops_per_clock = 2048;
  if (props->major == 9 && props->minor == 0) peak.flops_per_clock = 4096;
  if (props->major == 10 && props->minor == 0) peak.flops_per_clock = 8192;
  int khz = 0;
  if (peak.flops_per_clock == 0 || cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, index) != cudaSuccess || khz <= 0)
    return TensorCorePeak{};
  peak.sms = props->multiProcessorCount;
  peak.max_mhz = khz / 1000.0;
  peak.tflops = static_cast<double>(peak.sms) * khz * 1e3 * peak.flops_per_clock / 1e12;
#endif
  return peak;
}

}  // namespace amplab
