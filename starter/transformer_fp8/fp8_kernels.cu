// Your copy of this lab's code: fill in every TODO(...) below; the tests tell you which one
// fails. (Instructors: generated from solution/ by scripts/make-starter.py; edit the solution.)
// Lab 7, the stretch (TODO 7): max |x| and the saturated FP8 cast as CUDA kernels that read x once.
// See labs/transformer_fp8/README.md, "Casts that cost one pass". The launchers check their
// arguments, pick the grid and launch on `stream`; the wrappers in transformer_fp8.cpp call them.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "amplab/infra/error.hpp"
#include "fp8_kernels.hpp"

namespace transformer_fp8 {
namespace {

constexpr int kThreads = 256;

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw amplab::Error(std::string(what) + ": CUDA error: " + cudaGetErrorString(status));
}

void check_count(const char* function, const char* name, int64_t value) {
  if (value < 0)
    throw amplab::Error(std::string(function) + ": " + name + " = " + std::to_string(value) + ": a size must be >= 0");
}

void check_multiple_of_16(const char* function, const char* name, int64_t value) {
  if (value % 16 != 0)
    throw amplab::Error(std::string(function) + ": " + name + " = " + std::to_string(value) +
                        ": the FP8 matmul needs multiples of 16");
}

// One wave of resident blocks on the current device (2048 threads per SM on sm_80 and later):
// a grid-stride loop covers the rest.
int64_t one_wave_blocks(int64_t items) {
  int device = 0, sms = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  return std::max<int64_t>(1, std::min<int64_t>((items + kThreads - 1) / kThreads, int64_t{sms} * (2048 / kThreads)));
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

__device__ __forceinline__ float as_float(float v) { return v; }
__device__ __forceinline__ float as_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float as_float(__half v) { return __half2float(v); }

// 16 bytes of T, loaded or stored in one instruction.
template <class T>
struct alignas(16) Pack {
  static constexpr int kCount = 16 / sizeof(T);
  T v[kCount];
};
// The fp8 bytes of one Pack<T>.
template <int kCount>
struct alignas(kCount) Fp8Pack {
  uint8_t v[kCount];
};

// max that keeps a NaN, as torch's max does (fmaxf would drop it).
__device__ __forceinline__ float max_keeping_nan(float a, float b) { return (b > a || isnan(b)) ? b : a; }

// v saturated to the format's range, then rounded to the nearest fp8 value (ties to even).
template <bool kE5m2>
__device__ __forceinline__ uint8_t saturated_fp8(float v) {
  const float limit = kE5m2 ? 57344.0f : 448.0f;
  if (!isnan(v)) v = fminf(fmaxf(v, -limit), limit);
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, kE5m2 ? __NV_E5M2 : __NV_E4M3);
}

template <class T>
__global__ void abs_max_kernel(const T* __restrict__ x, int64_t n, bool vector, float* __restrict__ amax) {
  // TODO(transformer_fp8-7): A grid-stride loop over 16-byte Packs (when `vector`; the elements
  // after the last whole Pack, or all of them when not, one by one), each thread keeping its own
  // max of |x|; then the block's max (__shfl_xor_sync within each warp, the warps' maxima through
  // shared memory) and one atomicMax per block into *amax. Pitfalls: a NaN must win, as in
  // torch's max (fmaxf drops it: max_keeping_nan); there is no float atomicMax, but for
  // non-negative floats the order of their bits as int is the order of the values
  // (__float_as_int), and a positive NaN's bits are above infinity's.
  AMPLAB_TODO_DEVICE("transformer_fp8-7");
}

template <class T, bool kE5m2>
__global__ void to_fp8_kernel(const T* __restrict__ x, int64_t n, bool vector, const float* __restrict__ scale,
                              uint8_t* __restrict__ out) {
  // TODO(transformer_fp8-7): The same grid-stride loop; each element x * (*scale) in float32,
  // saturated and rounded (saturated_fp8), each Pack's bytes stored in one Fp8Pack. Pitfall: read
  // *scale once per thread, not once per element.
  AMPLAB_TODO_DEVICE("transformer_fp8-7");
}

constexpr int kTile = 64;  // the transposing cast's tile: kTile x kTile elements per block

template <class T, bool kE5m2>
__global__ void to_fp8_transposed_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                         const float* __restrict__ scale, uint8_t* __restrict__ out,
                                         uint8_t* __restrict__ out_t) {
  // TODO(transformer_fp8-7): Each block owns a 64 x 64 tile of x (the launcher's grid). Two passes
  // through shared memory: the first reads the tile row by row in 16-byte Packs, casts each
  // element (saturated_fp8) and writes the bytes to `out` and to a shared tile; after a
  // __syncthreads the second reads the shared tile column by column and writes those bytes to
  // out_t, where a tile column is part of a row: choose the threads' work so that a warp's
  // stores to out_t are long runs of consecutive bytes, as the first pass's are. Pitfalls: the
  // edge tiles (rows or cols not a multiple of 64: bound every load and store); index in int64
  // (rows * cols can exceed 2^31); the column reads of the second pass all hit one shared-memory
  // bank unless the tile's rows are padded.
  AMPLAB_TODO_DEVICE("transformer_fp8-7");
}

template <class T>
void launch_abs_max(const void* x, int64_t n, float* amax, cudaStream_t stream) {
  const bool vector = aligned16(x);
  const int64_t blocks = one_wave_blocks(vector ? n / Pack<T>::kCount + 1 : n);
  abs_max_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(static_cast<const T*>(x), n, vector, amax);
  check_cuda(cudaGetLastError(), "abs_max_kernel");
}

template <class T>
void launch_to_fp8(const void* x, int64_t n, const float* scale, bool e5m2, void* out, cudaStream_t stream) {
  const bool vector = aligned16(x) && aligned16(out);
  const int64_t blocks = one_wave_blocks(vector ? n / Pack<T>::kCount + 1 : n);
  auto kernel = e5m2 ? to_fp8_kernel<T, true> : to_fp8_kernel<T, false>;
  kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(static_cast<const T*>(x), n, vector, scale,
                                                                  static_cast<uint8_t*>(out));
  check_cuda(cudaGetLastError(), "to_fp8_kernel");
}

template <class T>
void launch_to_fp8_transposed(const void* x, int64_t rows, int64_t cols, const float* scale, bool e5m2, void* out,
                              void* out_t, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile), static_cast<unsigned>((rows + kTile - 1) / kTile));
  auto kernel = e5m2 ? to_fp8_transposed_kernel<T, true> : to_fp8_transposed_kernel<T, false>;
  kernel<<<grid, kThreads, 0, stream>>>(static_cast<const T*>(x), rows, cols, scale, static_cast<uint8_t*>(out),
                                        static_cast<uint8_t*>(out_t));
  check_cuda(cudaGetLastError(), "to_fp8_transposed_kernel");
}

}  // namespace

void abs_max_launch(const void* x, CastInput type, int64_t n, float* amax, cudaStream_t stream) {
  // TODO(transformer_fp8-7): Check n (check_count), launch nothing for n == 0 (before any CUDA
  // call: the tests call this without a GPU), then launch_abs_max for x's element type.
  AMPLAB_TODO("transformer_fp8-7");
}

void to_fp8_launch(const void* x, CastInput type, int64_t n, const float* scale, bool e5m2, void* out,
                   cudaStream_t stream) {
  // TODO(transformer_fp8-7): The same checks, then launch_to_fp8 for x's element type.
  AMPLAB_TODO("transformer_fp8-7");
}

void to_fp8_transposed_launch(const void* x, CastInput type, int64_t rows, int64_t cols, const float* scale, bool e5m2,
                              void* out, void* out_t, cudaStream_t stream) {
  // TODO(transformer_fp8-7): Check rows and cols (check_count; multiples of 16:
  // check_multiple_of_16; rows / 64 blocks must fit gridDim.y), nothing for an empty x, then
  // launch_to_fp8_transposed for x's element type.
  AMPLAB_TODO("transformer_fp8-7");
}

}  // namespace transformer_fp8
