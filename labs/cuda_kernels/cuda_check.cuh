// Lab 6, CUDA kernels: helpers the .cu files share (given). Host-side argument checks that throw
// amplab::Error naming the function and the argument, CUDA error checks, the device's SM count,
// and small device-side helpers (fp32 <-> bf16, GELU). Included by .cu files only (nvcc).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "amplab/infra/error.hpp"
#include "kernels.hpp"

namespace cuda_kernels {

// ---- host: arguments ------------------------------------------------------------------------------

// "<function>: <name> = <value>: <what is wrong>", thrown as amplab::Error.
[[noreturn]] inline void bad_argument(const char* function, const char* name, int64_t value, const char* why) {
  throw amplab::Error(std::string(function) + ": " + name + " = " + std::to_string(value) + ": " + why);
}

// A size (elements) must be >= 0.
inline void check_size(const char* function, const char* name, int64_t value) {
  if (value < 0) bad_argument(function, name, value, "a size must be >= 0");
}

// Threads per block: a multiple of 32 (whole warps) in [32, 1024]; `power_of_two` for tree reductions.
inline void check_threads(const char* function, int threads, bool power_of_two) {
  if (threads < 32 || threads > 1024 || threads % 32 != 0)
    bad_argument(function, "threads", threads, "threads per block must be a multiple of 32 in [32, 1024]");
  if (power_of_two && (threads & (threads - 1)) != 0)
    bad_argument(function, "threads", threads, "a tree reduction halves the block: threads must be a power of two");
}

// ---- host: CUDA errors -------------------------------------------------------------------------

inline void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw amplab::Error(std::string(what) + ": CUDA error: " + cudaGetErrorString(status));
}

// After a kernel launch: a bad configuration (too many threads, too much shared memory) is only
// reported by cudaGetLastError. (Errors while the kernel runs surface at the next synchronize.)
inline void check_launch(const char* kernel) { check_cuda(cudaGetLastError(), kernel); }

// Streaming multiprocessors of the current device (132 on an H100 SXM or H200).
inline int sm_count() {
  int device = 0, sms = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  return sms;
}

// How many blocks of `kernel` with `threads` threads (and `shared_bytes` of dynamic shared memory)
// fit on one SM at once: registers, shared memory and the 2048-thread limit decide.
template <class Kernel>
int blocks_per_sm(Kernel kernel, int threads, size_t shared_bytes = 0) {
  int blocks = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, shared_bytes),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  return blocks > 0 ? blocks : 1;
}

// Whether a pointer is aligned for 16-byte (float4 / uint4) loads and stores.
__host__ __device__ inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

__host__ __device__ inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- device: element types and GELU --------------------------------------------------------------

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16(v); }  // nearest even

// GELU, tanh approximation, and its derivative, in fp32, as PyTorch's CUDA kernels compute them
// (aten/src/ATen/native/cuda/ActivationGeluKernel.cu, approximate="tanh").
constexpr float kGeluBeta = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluKappa = 0.044715f;

__device__ __forceinline__ float gelu_tanh(float z) {
  const float inner = kGeluBeta * (z + kGeluKappa * z * z * z);
  return 0.5f * z * (1.f + tanhf(inner));
}

// d gelu / dz at z.
__device__ __forceinline__ float gelu_tanh_grad(float z) {
  const float z2 = z * z;
  const float t = tanhf(kGeluBeta * (z + kGeluKappa * z2 * z));
  const float left = 0.5f * z, right = 1.f + t;
  return 0.5f * right + left * (1.f - t * t) * kGeluBeta * (1.f + 3.f * kGeluKappa * z2);
}

}  // namespace cuda_kernels
