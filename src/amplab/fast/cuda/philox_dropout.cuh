// Dropout inside a kernel of ours, with its mask drawn from the CUDA generator as PyTorch's own
// dropout draws it: graph-safe (under capture the seed and offset are read at replay from the
// generator's tensors), and the generator's state (in every checkpoint) moves on as it would, so
// that resuming stays exact. The backward draws the same mask again from the seed and offset the
// forward wrote down. Shared by residual_norm_kernels.cu and mnist_head_kernels.cu.
#pragma once

#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/PhiloxCudaState.h>
#include <curand_philox4x32_x.h>

#include <mutex>

namespace amplab::cuda {

// The default generator's state for one dropout call on `device`, moved on by 4 numbers per
// thread-subsequence: one Philox call (keep4) per 4 elements.
inline at::PhiloxCudaState philox_state_for_dropout(c10::Device device) {
  auto* gen = at::get_generator_or_default<at::CUDAGeneratorImpl>(
      std::nullopt, at::cuda::detail::getDefaultCUDAGenerator(device.index()));
  std::lock_guard<std::mutex> lock(gen->mutex_);
  return gen->philox_cuda_state(4);
}

// at::cuda::philox::unpack's reading, written out (it needs nvcc's --expt-relaxed-constexpr).
__device__ __forceinline__ void philox_seed_offset(const at::PhiloxCudaState& philox, uint64_t& seed, uint64_t& offset) {
  seed = philox.captured_ ? static_cast<uint64_t>(*philox.seed_.ptr) : philox.seed_.val;
  offset = philox.captured_ ? static_cast<uint64_t>(*philox.offset_.ptr) + philox.offset_intragraph_ : philox.offset_.val;
}

// Which of the four elements 4 * quad .. + 3 (counted over the whole tensor) dropout keeps. One
// Philox call, counter (offset / 4, quad) under key seed: what curand_init(seed, quad, offset) and
// curand_uniform4 would draw, so the offsets the generator hands out (4 per quad) stay disjoint
// from other kernels'. An element is kept when its uniform in (0, 1] is below keep.
__device__ __forceinline__ void keep4(uint64_t seed, uint64_t offset, uint64_t quad, float keep, bool kept[4]) {
  const uint64_t block = offset / 4;
  const uint4 counter = make_uint4(static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                                   static_cast<uint32_t>(quad), static_cast<uint32_t>(quad >> 32));
  const uint2 key = make_uint2(static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  const uint4 r = curand_Philox4x32_10(counter, key);
  constexpr float k2pow32inv = 2.3283064365386963e-10f;
  kept[0] = r.x * k2pow32inv + k2pow32inv / 2 < keep;
  kept[1] = r.y * k2pow32inv + k2pow32inv / 2 < keep;
  kept[2] = r.z * k2pow32inv + k2pow32inv / 2 < keep;
  kept[3] = r.w * k2pow32inv + k2pow32inv / 2 < keep;
}

}  // namespace amplab::cuda
