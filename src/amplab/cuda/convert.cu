#include "amplab/cuda/convert.hpp"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

namespace amplab::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void bf16_to_float_kernel(const __nv_bfloat16* __restrict__ from, float* __restrict__ to, int64_t n) {
  const int64_t vectors = n / 8;  // eight values: one 16-byte load, two 16-byte stores
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors; i += stride) {
    uint4 raw = reinterpret_cast<const uint4*>(from)[i];
    const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
    float2 a = __bfloat1622float2(pairs[0]), b = __bfloat1622float2(pairs[1]);
    float2 c = __bfloat1622float2(pairs[2]), d = __bfloat1622float2(pairs[3]);
    reinterpret_cast<float4*>(to)[2 * i] = make_float4(a.x, a.y, b.x, b.y);
    reinterpret_cast<float4*>(to)[2 * i + 1] = make_float4(c.x, c.y, d.x, d.y);
  }
  for (int64_t i = vectors * 8 + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    to[i] = __bfloat162float(from[i]);
}

bool aligned(const at::Tensor& t) { return reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0; }

}  // namespace

bool bf16_to_float_supported(const at::Tensor& from, const at::Tensor& to) {
  return from.defined() && to.defined() && from.is_cuda() && to.device() == from.device() &&
         from.scalar_type() == at::kBFloat16 && to.scalar_type() == at::kFloat && from.sizes() == to.sizes() &&
         from.strides() == to.strides() && from.is_non_overlapping_and_dense() && aligned(from) && aligned(to);
}

void bf16_to_float(const at::Tensor& from, const at::Tensor& to) {
  TORCH_CHECK(bf16_to_float_supported(from, to), "bf16_to_float: unsupported tensors (see bf16_to_float_supported)");
  const int64_t n = from.numel();
  if (n == 0) return;
  c10::cuda::CUDAGuard device(from.device());
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t wanted = (std::max<int64_t>(n / 8, 1) + kThreads - 1) / kThreads;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(wanted, static_cast<int64_t>(sms) * 8));
  bf16_to_float_kernel<<<blocks, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const __nv_bfloat16*>(from.const_data_ptr()), to.mutable_data_ptr<float>(), n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace amplab::cuda
