#include "amplab/fast/cuda/fp8_cast_kernels.hpp"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

namespace amplab::cuda {

namespace {

constexpr int kTile = 64;      // a block casts 64 x 64 tiles, one after another
constexpr int kThreads = 256;  // 8 threads a tile row (8 elements each), 32 rows at a time
constexpr int kRowWords = kTile / 4 + 1;  // a tile row's 64 fp8 bytes, one 4-byte word of padding

__device__ __forceinline__ void load8(const float* p, float v[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

__device__ __forceinline__ void load8(const __nv_bfloat16* p, float v[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(pairs[i]);
    v[2 * i] = f.x, v[2 * i + 1] = f.y;
  }
}

// Eight values times scale, saturated and rounded to e4m3 (e5m2), as 8 bytes in memory order.
__device__ __forceinline__ uint2 to_fp8x8(const float v[8], float scale, bool e5m2) {
  const __nv_fp8_interpretation_t format = e5m2 ? __NV_E5M2 : __NV_E4M3;
  uint32_t word[2];
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    const auto lo = __nv_cvt_float2_to_fp8x2(make_float2(v[4 * w] * scale, v[4 * w + 1] * scale), __NV_SATFINITE, format);
    const auto hi = __nv_cvt_float2_to_fp8x2(make_float2(v[4 * w + 2] * scale, v[4 * w + 3] * scale), __NV_SATFINITE, format);
    word[w] = uint32_t{lo} | uint32_t{hi} << 16;
  }
  return make_uint2(word[0], word[1]);
}

// The block's largest value of `v` (>= 0) into *amax: float bits of non-negative numbers order as
// integers do, so an integer atomicMax is a float one.
__device__ __forceinline__ void block_max_into(float v, float* amax) {
  __shared__ float warp_max[kThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) v = fmaxf(v, warp_max[w]);
    atomicMax(reinterpret_cast<int*>(amax), __float_as_int(v));
  }
}

// Tile t of a (rows, cols) x: thread (row r0 and r0 + 32, columns 8 * chunk .. + 7) loads, casts
// and writes its bytes row-major, and leaves them in shared memory; then thread (column tj,
// rows 16 * tq .. + 15) writes 16 bytes of the transpose. A grid-stride loop over the tiles keeps
// the blocks, and so the atomics on amax, few.
template <class T>
__global__ void __launch_bounds__(kThreads)
    cast_kernel(const T* __restrict__ x, const __nv_bfloat16* __restrict__ gate, int64_t rows, int64_t cols,
                Fp8CastInput input, const float* __restrict__ scale_at, bool e5m2, uint8_t* __restrict__ out,
                uint8_t* __restrict__ out_t, float* __restrict__ amax) {
  __shared__ uint32_t tile[kTile][kRowWords];
  const float scale = *scale_at;
  const int64_t tile_cols = cols / kTile, tiles = rows / kTile * tile_cols;
  const int chunk = threadIdx.x % 8, r0 = threadIdx.x / 8;
  const int tj = threadIdx.x / 4, tq = threadIdx.x % 4;
  const bool cast = out != nullptr || out_t != nullptr;
  float largest = 0.f;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t row0 = t / tile_cols * kTile, col0 = t % tile_cols * kTile;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r0 + 32 * h;
      const int64_t at = (row0 + r) * cols + col0 + 8 * chunk;
      float v[8];
      load8(x + at, v);
      if (input == Fp8CastInput::gated) {
        float g[8];
        load8(gate + at, g);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = g[i] <= 0.f ? 0.f : v[i];  // as threshold_backward: a NaN gate keeps
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if (input == Fp8CastInput::round_bf16) v[i] = __bfloat162float(__float2bfloat16_rn(v[i]));
        if (input == Fp8CastInput::relu) v[i] = v[i] < 0.f ? 0.f : v[i];  // a NaN stays NaN, as torch::relu
        largest = fmaxf(largest, fabsf(v[i]));
      }
      if (cast) {
        const uint2 bytes = to_fp8x8(v, scale, e5m2);
        if (out != nullptr) *reinterpret_cast<uint2*>(out + at) = bytes;
        tile[r][2 * chunk] = bytes.x;
        tile[r][2 * chunk + 1] = bytes.y;
      }
    }
    if (out_t != nullptr) {
      __syncthreads();
      const uint8_t* bytes = reinterpret_cast<const uint8_t*>(&tile[0][0]);
      uint32_t word[4];
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        word[w] = 0;
#pragma unroll
        for (int b = 0; b < 4; ++b) word[w] |= uint32_t{bytes[(16 * tq + 4 * w + b) * kRowWords * 4 + tj]} << (8 * b);
      }
      *reinterpret_cast<uint4*>(out_t + (col0 + tj) * rows + row0 + 16 * tq) = make_uint4(word[0], word[1], word[2], word[3]);
      __syncthreads();  // the next tile overwrites the shared bytes
    }
  }
  block_max_into(largest, amax);
}

__global__ void advance_kernel(float* __restrict__ history, float* __restrict__ pending, int* __restrict__ next,
                               const float* __restrict__ limits, float* __restrict__ scales, int states, int length) {
  const int s = threadIdx.x, slot = *next;
  if (s < states) {
    float* ring = history + int64_t{s} * length;
    ring[slot] = pending[s];
    pending[s] = 0.f;
    float largest = 0.f;
    for (int i = 0; i < length; ++i) largest = fmaxf(largest, ring[i]);
    const float scale = largest > 0.f ? limits[s] / fmaxf(largest, 1e-12f) : 1.f;
    scales[8 * s] = scale;  // [s][0][0]
    scales[8 * s + 4] = 1.f / scale;  // [s][1][0]
  }
  __syncthreads();  // every thread has read *next
  if (s == 0) *next = (slot + 1) % length;
}

bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

}  // namespace

bool fp8_cast_supported(const at::Tensor& x, const at::Tensor& gate) {
  if (!x.defined() || !x.is_cuda() || x.dim() != 2 || !x.is_contiguous() || !aligned16(x)) return false;
  if (x.scalar_type() != at::kFloat && x.scalar_type() != at::kBFloat16) return false;
  if (x.size(0) % kTile != 0 || x.size(1) % kTile != 0 || x.numel() == 0) return false;
  if (!gate.defined()) return true;
  return gate.scalar_type() == at::kBFloat16 && gate.is_cuda() && gate.sizes() == x.sizes() && gate.is_contiguous() &&
         aligned16(gate);
}

void fp8_cast(const at::Tensor& x, Fp8CastInput input, const at::Tensor& gate, const at::Tensor& scale,
              const at::Tensor& out, const at::Tensor& out_t, const at::Tensor& amax) {
  const bool gated = input == Fp8CastInput::gated;
  TORCH_CHECK(fp8_cast_supported(x, gated ? gate : at::Tensor()) && gated == gate.defined(),
              "amplab fp8_cast: unsupported input");
  TORCH_CHECK(input != Fp8CastInput::round_bf16 || x.scalar_type() == at::kFloat,
              "amplab fp8_cast: round_bf16 takes float32");
  const at::Tensor& any_out = out.defined() ? out : out_t;
  const bool e5m2 = any_out.defined() && any_out.scalar_type() == at::kFloat8_e5m2;
  const int64_t rows = x.size(0), cols = x.size(1);
  TORCH_CHECK(!out.defined() || (out.is_contiguous() && out.size(0) == rows && out.size(1) == cols && aligned16(out)),
              "amplab fp8_cast: out must be a contiguous (rows, cols) fp8 tensor");
  TORCH_CHECK(!out_t.defined() || (out_t.is_contiguous() && out_t.size(0) == cols && out_t.size(1) == rows &&
                                   aligned16(out_t) && out_t.scalar_type() == any_out.scalar_type()),
              "amplab fp8_cast: out_t must be a contiguous (cols, rows) fp8 tensor of out's format");
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t tiles = rows / kTile * (cols / kTile);
  const int64_t resident = int64_t{at::cuda::getCurrentDeviceProperties()->multiProcessorCount} * (2048 / kThreads);
  const auto blocks = static_cast<unsigned>(std::min(tiles, resident));
  auto* out_bytes = out.defined() ? static_cast<uint8_t*>(out.data_ptr()) : nullptr;
  auto* out_t_bytes = out_t.defined() ? static_cast<uint8_t*>(out_t.data_ptr()) : nullptr;
  const auto* gate_ptr = gated ? static_cast<const __nv_bfloat16*>(gate.data_ptr()) : nullptr;
  auto stream = at::cuda::getCurrentCUDAStream();
  if (x.scalar_type() == at::kFloat)
    cast_kernel<float><<<blocks, kThreads, 0, stream>>>(x.data_ptr<float>(), gate_ptr, rows, cols, input,
                                                        scale.data_ptr<float>(), e5m2, out_bytes, out_t_bytes,
                                                        amax.data_ptr<float>());
  else
    cast_kernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(x.data_ptr()), gate_ptr, rows, cols, input, scale.data_ptr<float>(), e5m2,
        out_bytes, out_t_bytes, amax.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void fp8_scales_advance(const at::Tensor& history, const at::Tensor& pending, const at::Tensor& next,
                        const at::Tensor& limits, const at::Tensor& scales) {
  const auto states = static_cast<int>(history.size(0)), length = static_cast<int>(history.size(1));
  TORCH_CHECK(states >= 1 && states <= 1024 && pending.numel() == states && limits.numel() == states &&
                  scales.numel() == 8 * states && next.numel() == 1 && next.scalar_type() == at::kInt,
              "amplab fp8_scales_advance: mismatched state tensors");
  const c10::cuda::CUDAGuard guard(history.device());
  advance_kernel<<<1, (states + 31) / 32 * 32, 0, at::cuda::getCurrentCUDAStream()>>>(
      history.data_ptr<float>(), pending.data_ptr<float>(), next.data_ptr<int>(), limits.data_ptr<float>(),
      scales.data_ptr<float>(), states, length);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace amplab::cuda
