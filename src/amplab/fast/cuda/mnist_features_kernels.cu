#include "amplab/fast/cuda/mnist_features_kernels.hpp"

#include <ATen/NumericUtils.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>
#include <type_traits>

#include "amplab/fast/cuda/bias_relu.cuh"
#include "amplab/fast/cuda/philox_dropout.cuh"

namespace amplab::cuda {

namespace {

// ---- sizes and shared-memory layout -------------------------------------------------------------

constexpr int kImage = 28;                            // the input's height and width
constexpr int kConv1 = 26;                            // conv1's output height and width
constexpr int kConv2 = 24;                            // conv2's
constexpr int kPooled = 12;                           // the pool's
constexpr int kC1 = 32, kC2 = 64;                     // the two layers' channels
constexpr int kPooledSize = kC2 * kPooled * kPooled;  // 9216 outputs an image
constexpr int kQuarter = kPooledSize / 4;             // dropout: one Philox call per 4 outputs
constexpr int kThreads = 512, kWarps = kThreads / 32;

// conv2's output positions are numbered in rows of conv1's width, p = y * 26 + x (x = 24 and 25 are
// computed and dropped), so that the 3x3 tap (ky, kx) of position p is conv1's position
// p + ky * 26 + kx: a GEMM tile of 16 positions is 16 consecutive rows of conv1's output in shared
// memory, whatever the tap.
constexpr int kOutPositions = kConv2 * kConv1;  // 624 = 39 tiles of 16
constexpr int kA1Positions = kConv1 * kConv1;   // 676
constexpr int kMaxShift = 2 * kConv1 + 2;       // 54, the last tap's
constexpr int kA1Rows = 680;                    // > 623 + 54; rows from 676 on are zeros
constexpr int kDgradTiles = 43;                 // 688 >= 676 positions of conv1's input gradient
constexpr int kG2Rows = kMaxShift + kDgradTiles * 16;  // conv2's gradient at row 54 + p, zeros around it
constexpr int kK2 = 9 * kC1;                    // conv2's reduction, tap-major: k = tap * 32 + ci
__host__ __device__ constexpr int tap_shift(int tap) { return (tap / 3) * kConv1 + tap % 3; }

// Row strides in 16-bit elements. ldmatrix reads 8 rows of 16 bytes at once; with a stride that is an
// odd multiple of 16 bytes they fall in 8 different bank groups.
constexpr int kA1Stride = 40;  // conv1's output [position][channel], 32 channels + 8
constexpr int kW2Stride = 72;  // conv2's weight [tap * 32 + ci][co], 64 + 8
constexpr int kG2Stride = 72;  // conv2's output gradient [54 + p][co]
constexpr int kC2Stride = 66;  // conv2's output [p][co] before the pool: plain loads, an odd word stride

// One image's partial sums, in floats: conv2's weight [k][co], conv2's bias, conv1's weight [c][tap],
// conv1's bias.
constexpr int kW2Sums = 0, kB2Sums = kK2 * kC2, kW1Sums = kB2Sums + kC2, kB1Sums = kW1Sums + kC1 * 9;
constexpr int kPartial = kB1Sums + kC1;  // 18816

constexpr int kA1Bytes = kA1Rows * kA1Stride * 2;        // 54400
constexpr int kW2Bytes = kK2 * kW2Stride * 2;            // 41472
constexpr int kC2Bytes = kOutPositions * kC2Stride * 2;  // 82368
constexpr int kG2Bytes = kG2Rows * kG2Stride * 2;        // 106848
// The pooled gradient's 8-element vectors: 18 a channel. Backward keeps each vector's sum (conv2's bias).
constexpr int kVectors = kPooledSize / 8, kVectorsPerChannel = kPooled * kPooled / 8;
// image, conv1's weight and bias, conv2's bias, the vectors' sums
constexpr int kSmallBytes = (kImage * kImage + kC1 * 9 + kC1 + kC2 + kVectors) * 4;
constexpr int kForwardBytes = kA1Bytes + kW2Bytes + kC2Bytes + kSmallBytes;
constexpr int kBackwardBytes = kA1Bytes + kW2Bytes + kG2Bytes + kSmallBytes;
static_assert(kA1Bytes % 16 == 0 && kW2Bytes % 16 == 0 && kC2Bytes % 16 == 0 && kG2Bytes % 16 == 0);
static_assert(kWarps * kC1 * 10 * 4 <= kG2Bytes, "conv1's weight-gradient sums reuse conv2's gradient's space");

template <class scalar_t>
struct Smem {
  scalar_t* a1;  // conv1's output (backward: then its gradient)
  scalar_t* w2;
  scalar_t* big; // forward: conv2's output; backward: conv2's output gradient
  float *image, *w1, *b1, *b2, *vector_sums;

  __device__ explicit Smem(unsigned char* base, int big_bytes) {
    a1 = reinterpret_cast<scalar_t*>(base);
    w2 = reinterpret_cast<scalar_t*>(base + kA1Bytes);
    big = reinterpret_cast<scalar_t*>(base + kA1Bytes + kW2Bytes);
    image = reinterpret_cast<float*>(base + kA1Bytes + kW2Bytes + big_bytes);
    w1 = image + kImage * kImage;
    b1 = w1 + kC1 * 9;
    b2 = b1 + kC1;
    vector_sums = b2 + kC2;
  }
};

template <class input_t>
struct Args {
  const input_t* x;
  const float *w1, *b1, *w2, *b2;
  int64_t w1_stride[4], w2_stride[4], b1_stride, b2_stride;
};

// ---- PyTorch's rounding, and the tensor-core instructions ------------------------------------------

template <class scalar_t>
__device__ __forceinline__ float rounded(float v) {
  return static_cast<float>(static_cast<scalar_t>(v));
}

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 tiles of 16-bit values; lane l gives the address of row l % 8 of tile l / 8.
__device__ __forceinline__ void load_tiles(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}
__device__ __forceinline__ void load_tiles_transposed(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}

// c (16 x 8, fp32) += a (16 x 16) b (16 x 8). Lane l holds c at rows l / 4 and l / 4 + 8, columns
// 2 (l % 4) and the next.
template <class scalar_t>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// ---- what forward and backward both do --------------------------------------------------------------

// conv2's weight as w2[tap * 32 + ci][co], rounded to scalar_t (the autocast cast). The weight is
// contiguous or channels-last (mnist_features_supported): i walks it in memory order, so a warp reads
// 128 consecutive bytes. The loads go out in batches before their stores: the compiler cannot tell
// global from shared memory here, and would otherwise wait for each load in turn.
template <class scalar_t, class input_t>
__device__ void load_conv2_weight(const Args<input_t>& a, scalar_t* w2) {
  constexpr int kPerThread = kK2 * kC2 / kThreads, kBatch = kPerThread / 2;
  static_assert(kK2 * kC2 % kThreads == 0 && kPerThread % 2 == 0);
  const bool channels_last = a.w2_stride[1] == 1;
#pragma unroll 1
  for (int first = 0; first < kPerThread; first += kBatch) {
    float v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) v[u] = __ldg(a.w2 + (first + u) * kThreads + threadIdx.x);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = (first + u) * kThreads + threadIdx.x;
      int co, ci, tap;
      if (channels_last) ci = i % kC1, tap = (i / kC1) % 9, co = i / kK2;  // (co, ky, kx, ci)
      else tap = i % 9, ci = (i / 9) % kC1, co = i / kK2;                  // (co, ci, ky, kx)
      w2[(tap * kC1 + ci) * kW2Stride + co] = static_cast<scalar_t>(v[u]);
    }
  }
}

// The image, conv1's weight and biases into shared memory (rounded to scalar_t), then conv1 + bias +
// ReLU into a1[position][channel]: the nine products summed in float (ky, kx order), rounded before
// the bias, as the network's one-channel convolution kernel computes it (layer_kernels.cu). A thread
// keeps one channel's weights in registers and walks rows of positions, the 3 x 3 pixels under it
// sliding along in registers; a warp's 32 channels read the same pixels.
template <class scalar_t, class input_t>
__device__ void conv1_into_shared(const Args<input_t>& a, int n, Smem<scalar_t>& s) {
  static_assert(kImage * kImage <= 2 * kThreads && kC1 * 9 <= kThreads && kC1 + kC2 <= kThreads);
  const input_t* image = a.x + int64_t{n} * kImage * kImage;
  const int i = threadIdx.x, j = threadIdx.x + kThreads;
  // every load first, then every store
  const float pixel0 = static_cast<float>(image[i]);
  const float pixel1 = j < kImage * kImage ? static_cast<float>(image[j]) : 0.f;
  const float weight = i < kC1 * 9 ? __ldg(a.w1 + (i / 9) * a.w1_stride[0] + (i % 9 / 3) * a.w1_stride[2] + (i % 3) * a.w1_stride[3]) : 0.f;
  const float bias = i < kC1 ? __ldg(a.b1 + i * a.b1_stride) : i < kC1 + kC2 ? __ldg(a.b2 + (i - kC1) * a.b2_stride) : 0.f;
  s.image[i] = rounded<scalar_t>(pixel0);
  if (j < kImage * kImage) s.image[j] = rounded<scalar_t>(pixel1);
  if (i < kC1 * 9) s.w1[i] = rounded<scalar_t>(weight);
  if (i < kC1 + kC2) (i < kC1 ? s.b1[i] : s.b2[i - kC1]) = rounded<scalar_t>(bias);
  for (int k = kA1Positions * kA1Stride + threadIdx.x; k < kA1Rows * kA1Stride; k += kThreads) s.a1[k] = scalar_t(0.f);
  __syncthreads();
  const int c = threadIdx.x % kC1;
  float w[9];
#pragma unroll
  for (int tap = 0; tap < 9; ++tap) w[tap] = s.w1[c * 9 + tap];
  const scalar_t b = static_cast<scalar_t>(s.b1[c]);
  for (int y = threadIdx.x / kC1; y < kConv1; y += kThreads / kC1) {
    const float* rows = s.image + y * kImage;
    float px[3][3];  // px[ky][kx]: the pixel under tap (ky, kx) of position (y, x)
#pragma unroll
    for (int ky = 0; ky < 3; ++ky) px[ky][1] = rows[ky * kImage], px[ky][2] = rows[ky * kImage + 1];
#pragma unroll
    for (int x = 0; x < kConv1; ++x) {
      float acc = 0.f;
#pragma unroll
      for (int ky = 0; ky < 3; ++ky) {
        px[ky][0] = px[ky][1], px[ky][1] = px[ky][2], px[ky][2] = rows[ky * kImage + x + 2];
#pragma unroll
        for (int kx = 0; kx < 3; ++kx) acc += px[ky][kx] * w[ky * 3 + kx];
      }
      s.a1[(y * kConv1 + x) * kA1Stride + c] = add_relu(static_cast<scalar_t>(acc), b);
    }
  }
}

// ---- forward ---------------------------------------------------------------------------------------

// A warp's fragments for one k-step of 16: A's 16 x 16 and B's 16 x 8 kBlocks (64 or 32 columns). The GEMMs below load step k + 1's while step k's multiply, so that the tensor cores do not
// wait for each shared-memory load in turn (ldmatrix's asm is volatile: the compiler keeps its order).
template <int kBlocks>
struct Fragments {
  uint32_t a[4];
  uint32_t b[kBlocks / 2][4];  // two 8-column blocks per ldmatrix.x4
};

template <class scalar_t, int kBlocks>
__device__ __forceinline__ void multiply(float (&acc)[kBlocks][4], const Fragments<kBlocks>& f) {
#pragma unroll
  for (int nb = 0; nb < kBlocks / 2; ++nb) {
    mma<scalar_t>(acc[2 * nb], f.a, f.b[nb][0], f.b[nb][1]);
    mma<scalar_t>(acc[2 * nb + 1], f.a, f.b[nb][2], f.b[nb][3]);
  }
}

// steps k-steps: load(f, k) fills f for step k; two fragment sets in turn, named (no register arrays
// indexed at run time).
template <class scalar_t, int kBlocks, class Load>
__device__ __forceinline__ void pipelined_gemm(float (&acc)[kBlocks][4], int steps, Load&& load) {
  Fragments<kBlocks> f0, f1;
  load(f0, 0);
  for (int k = 0; k < steps; k += 2) {
    if (k + 1 < steps) load(f1, k + 1);
    multiply<scalar_t>(acc, f0);
    if (k + 2 < steps) load(f0, k + 2);
    if (k + 1 < steps) multiply<scalar_t>(acc, f1);
  }
}

// conv2 without its bias: c2[p][co] = sum over taps and ci of a1[p + shift(tap)][ci] w2[tap * 32 + ci][co],
// rounded to scalar_t. A warp takes 16 positions and all 64 output channels at a time (the wider the
// tile, the fewer loads from shared memory per product: their bandwidth is what bounds these GEMMs);
// k-step k is tap k / 2, input channels (k % 2) * 16...
template <class scalar_t>
__device__ void conv2_forward(const Smem<scalar_t>& s) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int tile = warp; tile < kOutPositions / 16; tile += kWarps) {
    float acc[8][4] = {};
    const int p0 = tile * 16;
    pipelined_gemm<scalar_t>(acc, 18, [&](Fragments<8>& f, int k) {
      const int tap = k / 2, half = k % 2;
      // A: rows positions p0.., columns channels half * 16..; B: rows k, columns co (transposed tiles)
      load_tiles(f.a, s.a1 + (p0 + tap_shift(tap) + lane % 16) * kA1Stride + half * 16 + (lane / 16) * 8);
      const scalar_t* b_row = s.w2 + (tap * kC1 + half * 16 + lane % 16) * kW2Stride + (lane / 16) * 8;
#pragma unroll
      for (int nb = 0; nb < 4; ++nb) load_tiles_transposed(f.b[nb], b_row + nb * 16);
    });
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        scalar_t* out = s.big + (p0 + g + 8 * h) * kC2Stride + j * 8 + 2 * t;
        out[0] = static_cast<scalar_t>(acc[j][2 * h]);
        out[1] = static_cast<scalar_t>(acc[j][2 * h + 1]);
      }
  }
}

// The dropout after the pool: probability keep of keeping an output, and where its Philox draws start.
struct PoolDropout {
  bool on = false;
  float keep = 1.f, scale = 1.f;
  uint64_t seed = 0, offset = 0;
};

// Bias + ReLU + 2x2 max-pool of conv2's output, y in NCHW order, then dropout. PyTorch scans a
// window's rows then columns and moves on when a value is greater or NaN; route keeps the one it took,
// whether the ReLU let it through (bit 2) and whether dropout kept it (bit 3). Thread j takes outputs
// j, j + kQuarter, j + 2 kQuarter, j + 3 kQuarter, whose dropout draws are the four numbers of one
// Philox call (counter: image * kQuarter + j), so a call serves four outputs and a warp's loads and
// stores stay consecutive.
template <class scalar_t>
__device__ void pool_forward(const Smem<scalar_t>& s, scalar_t* __restrict__ y, uint8_t* __restrict__ route,
                             const PoolDropout& dropout, uint64_t image) {
  for (int j = threadIdx.x; j < kQuarter; j += kThreads) {
    bool kept[4] = {true, true, true, true};
    if (dropout.on) keep4(dropout.seed, dropout.offset, image * kQuarter + j, dropout.keep, kept);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = j + e * kQuarter;
      const int co = i / (kPooled * kPooled), py = (i / kPooled) % kPooled, px = i % kPooled;
      const scalar_t* window = s.big + (2 * py * kConv1 + 2 * px) * kC2Stride + co;
      const scalar_t b = static_cast<scalar_t>(s.b2[co]);
      float best_value = -INFINITY;
      scalar_t best = static_cast<scalar_t>(0.f);
      int arg = 0;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const scalar_t v = add_relu(window[((k / 2) * kConv1 + k % 2) * kC2Stride], b);
        const float f = static_cast<float>(v);
        if (f > best_value || at::_isnan(f)) {
          best_value = f;
          best = v;
          arg = k;
        }
      }
      // dropout as PyTorch's: the value times the mask times 1 / keep, in float, then rounded
      y[i] = dropout.on ? static_cast<scalar_t>(best_value * (kept[e] ? 1.f : 0.f) * dropout.scale) : best;
      route[i] = static_cast<uint8_t>(arg | (passes(best) ? 4 : 0) | (kept[e] ? 8 : 0));
    }
  }
}

template <class scalar_t, class input_t>
__global__ void __launch_bounds__(kThreads, 1)
    features_forward_kernel(Args<input_t> a, scalar_t* __restrict__ y, uint8_t* __restrict__ route, float keep,
                            at::PhiloxCudaState philox) {
  extern __shared__ __align__(16) unsigned char shared[];
  Smem<scalar_t> s(shared, kC2Bytes);
  const int n = blockIdx.x;
  load_conv2_weight(a, s.w2);
  conv1_into_shared(a, n, s);
  __syncthreads();
  conv2_forward(s);
  __syncthreads();
  PoolDropout dropout;
  if (keep < 1.f) {
    dropout.on = true, dropout.keep = keep, dropout.scale = 1.f / keep;
    philox_seed_offset(philox, dropout.seed, dropout.offset);
  }
  pool_forward(s, y + int64_t{n} * kPooledSize, route + int64_t{n} * kPooledSize, dropout, n);
}

// ---- backward --------------------------------------------------------------------------------------

// The pooled gradient back through dropout, the pool and conv2's ReLU: g2[54 + p][co] (zeros wherever
// the pool did not take p, or the ReLU or dropout stopped it; what dropout kept times its scale,
// rounded as PyTorch's dropout backward rounds it); conv2's bias gradient is the sum of what got through. A
// thread takes 8 consecutive pooled values (one channel's), loads first: gradients and routes as one
// 16-byte and one 8-byte load.
template <class scalar_t>
__device__ void route_gradient(const scalar_t* __restrict__ grad_y, const uint8_t* __restrict__ route,
                               float dropout_scale, const Smem<scalar_t>& s, float* __restrict__ sums) {
  constexpr int kPerThread = (kVectors + kThreads - 1) / kThreads;
  uint4 g8[kPerThread];
  uint2 r8[kPerThread];
#pragma unroll
  for (int u = 0; u < kPerThread; ++u) {
    const int v = threadIdx.x + u * kThreads;
    if (v < kVectors) {
      g8[u] = __ldg(reinterpret_cast<const uint4*>(grad_y) + v);
      r8[u] = __ldg(reinterpret_cast<const uint2*>(route) + v);
    }
  }
#pragma unroll
  for (int u = 0; u < kPerThread; ++u) {
    const int v = threadIdx.x + u * kThreads;
    if (v >= kVectors) continue;
    const scalar_t* g = reinterpret_cast<const scalar_t*>(&g8[u]);
    const uint8_t* r = reinterpret_cast<const uint8_t*>(&r8[u]);
    float sum = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if ((r[e] & 12) != 12) continue;  // the ReLU or dropout stopped it
      const int i = v * 8 + e, co = i / (kPooled * kPooled), py = (i / kPooled) % kPooled, px = i % kPooled, k = r[e] & 3;
      const int p = (2 * py + k / 2) * kConv1 + 2 * px + k % 2;
      const scalar_t through = static_cast<scalar_t>(static_cast<float>(g[e]) * dropout_scale);
      s.big[(kMaxShift + p) * kG2Stride + co] = through;
      sum += static_cast<float>(through);
    }
    s.vector_sums[v] = sum;
  }
  __syncthreads();
  if (threadIdx.x < kC2) {
    float sum = 0.f;
    for (int k = 0; k < kVectorsPerChannel; ++k) sum += s.vector_sums[threadIdx.x * kVectorsPerChannel + k];
    sums[kB2Sums + threadIdx.x] = sum;
  }
}

// conv2's weight gradient: dw2[tap * 32 + ci][co] = sum over p of a1[p + shift(tap)][ci] g2[p][co]. A
// warp takes one tap and 16 input channels (16 rows of dw2), all 64 output channels.
template <class scalar_t>
__device__ void conv2_weight_gradient(const Smem<scalar_t>& s, float* __restrict__ sums) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int tile = warp; tile < kK2 / 16; tile += kWarps) {
    const int tap = tile / 2, half = tile % 2;
    float acc[8][4] = {};
    // A (rows ci, columns p) is conv1's output read position-major: transposed tiles.
    const scalar_t* a_row = s.a1 + (tap_shift(tap) + lane % 8 + (lane / 16) * 8) * kA1Stride + half * 16 + ((lane / 8) % 2) * 8;
    const scalar_t* b_row = s.big + (kMaxShift + lane % 16) * kG2Stride + (lane / 16) * 8;
    pipelined_gemm<scalar_t>(acc, kOutPositions / 16, [&](Fragments<8>& f, int k) {
      load_tiles_transposed(f.a, a_row + k * 16 * kA1Stride);
#pragma unroll
      for (int nb = 0; nb < 4; ++nb) load_tiles_transposed(f.b[nb], b_row + k * 16 * kG2Stride + nb * 16);
    });
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float2* out = reinterpret_cast<float2*>(sums + kW2Sums + (tile * 16 + g + 8 * h) * kC2 + j * 8 + 2 * t);
        *out = make_float2(acc[j][2 * h], acc[j][2 * h + 1]);
      }
  }
}

// conv2's input gradient, through conv1's ReLU, over conv1's output in place:
// a1[q][ci] <- passes(a1[q][ci]) ? sum over taps and co of g2[q - shift(tap)][co] w2[tap * 32 + ci][co] : 0,
// rounded to scalar_t as cuDNN's gradient is. A warp takes 16 positions and all 32 channels; it reads
// and writes only its own rows of a1.
template <class scalar_t>
__device__ void conv2_input_gradient(const Smem<scalar_t>& s) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int tile = warp; tile < kDgradTiles; tile += kWarps) {
    const int q0 = tile * 16;
    float acc[4][4] = {};
    // k-step k is tap k / 4, output channels (k % 4) * 16...
    pipelined_gemm<scalar_t>(acc, 9 * kC2 / 16, [&](Fragments<4>& f, int k) {
      const int tap = k / 4, kc = k % 4;
      load_tiles(f.a, s.big + (kMaxShift + q0 - tap_shift(tap) + lane % 16) * kG2Stride + kc * 16 + (lane / 16) * 8);
      // B (rows co, columns ci) is w2 read with ci as the row: plain tiles.
      const scalar_t* b_row = s.w2 + (tap * kC1 + lane % 8 + (lane / 16) * 8) * kW2Stride + kc * 16 + ((lane / 8) % 2) * 8;
#pragma unroll
      for (int nh = 0; nh < 2; ++nh) load_tiles(f.b[nh], b_row + nh * 16 * kW2Stride);
    });
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int q = q0 + g + 8 * h;
      if (q >= kA1Positions) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          scalar_t& v = s.a1[q * kA1Stride + j * 8 + 2 * t + e];
          v = passes(v) ? static_cast<scalar_t>(acc[j][2 * h + e]) : static_cast<scalar_t>(0.f);
        }
    }
  }
}

// conv1's weight and bias gradients from its output gradient (in a1) and the image: thread (part, c)
// sums channel c over the rows part, part + 16, ... (pixels sliding along in registers, as in conv1);
// the 16 parts are then added in order.
template <class scalar_t>
__device__ void conv1_weight_gradient(const Smem<scalar_t>& s, float* __restrict__ sums) {
  float* part_sums = reinterpret_cast<float*>(s.big);  // [part][c * 10 + k]: conv2's gradient is done
  static_assert(kThreads / kC1 == kWarps, "a part per warp");
  const int c = threadIdx.x % kC1, part = threadIdx.x / kC1;
  float acc[10] = {};
  for (int y = part; y < kConv1; y += kWarps) {
    const float* rows = s.image + y * kImage;
    float px[3][3];
#pragma unroll
    for (int ky = 0; ky < 3; ++ky) px[ky][1] = rows[ky * kImage], px[ky][2] = rows[ky * kImage + 1];
#pragma unroll
    for (int x = 0; x < kConv1; ++x) {
      const float g = static_cast<float>(s.a1[(y * kConv1 + x) * kA1Stride + c]);
#pragma unroll
      for (int ky = 0; ky < 3; ++ky) {
        px[ky][0] = px[ky][1], px[ky][1] = px[ky][2], px[ky][2] = rows[ky * kImage + x + 2];
#pragma unroll
        for (int kx = 0; kx < 3; ++kx) acc[ky * 3 + kx] += g * px[ky][kx];
      }
      acc[9] += g;
    }
  }
#pragma unroll
  for (int k = 0; k < 10; ++k) part_sums[part * kC1 * 10 + c * 10 + k] = acc[k];
  __syncthreads();
  for (int j = threadIdx.x; j < kC1 * 10; j += kThreads) {
    float total = 0.f;
    for (int p = 0; p < kWarps; ++p) total += part_sums[p * kC1 * 10 + j];
    const int channel = j / 10, k = j % 10;
    sums[k < 9 ? kW1Sums + channel * 9 + k : kB1Sums + channel] = total;
  }
}

template <class scalar_t, class input_t>
__global__ void __launch_bounds__(kThreads, 1)
    features_backward_kernel(Args<input_t> a, const scalar_t* __restrict__ grad_y, const uint8_t* __restrict__ route,
                             float dropout_scale, float* __restrict__ partial) {
  extern __shared__ __align__(16) unsigned char shared[];
  Smem<scalar_t> s(shared, kG2Bytes);
  const int n = blockIdx.x;
  float* sums = partial + int64_t{n} * kPartial;
  uint4* g2_words = reinterpret_cast<uint4*>(s.big);
  for (int i = threadIdx.x; i < kG2Bytes / 16; i += kThreads) g2_words[i] = make_uint4(0, 0, 0, 0);
  load_conv2_weight(a, s.w2);
  conv1_into_shared(a, n, s);  // conv1 again, from the image: cheaper than keeping it
  __syncthreads();
  route_gradient(grad_y + int64_t{n} * kPooledSize, route + int64_t{n} * kPooledSize, dropout_scale, s, sums);
  __syncthreads();
  conv2_weight_gradient(s, sums);
  __syncthreads();  // a1 is read across all its rows above, and overwritten below
  conv2_input_gradient(s);
  __syncthreads();
  conv1_weight_gradient(s, sums);
}

// The images' partial sums added in a fixed order (deterministic), rounded to scalar_t (each
// layer's gradient in the autocast dtype), into float32 gradients in their parameters' layouts.
struct GradOut {
  float *w1, *b1, *w2, *b2;
  int64_t w1_stride[4], w2_stride[4], b1_stride, b2_stride;
};

template <class scalar_t>
__global__ void sum_over_images_kernel(const float* __restrict__ partial, int images, GradOut out) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= kPartial) return;
  float acc[4] = {};
  int n = 0;
  for (; n + 4 <= images; n += 4)
#pragma unroll
    for (int u = 0; u < 4; ++u) acc[u] += partial[int64_t{n + u} * kPartial + j];
  for (; n < images; ++n) acc[0] += partial[int64_t{n} * kPartial + j];
  const float v = rounded<scalar_t>((acc[0] + acc[1]) + (acc[2] + acc[3]));
  if (j < kB2Sums) {
    const int k = j / kC2, co = j % kC2, tap = k / kC1, ci = k % kC1;
    out.w2[co * out.w2_stride[0] + ci * out.w2_stride[1] + (tap / 3) * out.w2_stride[2] + (tap % 3) * out.w2_stride[3]] = v;
  } else if (j < kW1Sums) {
    out.b2[(j - kB2Sums) * out.b2_stride] = v;
  } else if (j < kB1Sums) {
    const int c = (j - kW1Sums) / 9, tap = (j - kW1Sums) % 9;
    out.w1[c * out.w1_stride[0] + (tap / 3) * out.w1_stride[2] + (tap % 3) * out.w1_stride[3]] = v;
  } else {
    out.b1[(j - kB1Sums) * out.b1_stride] = v;
  }
}

// ---- host side ----------------------------------------------------------------------------------------

bool is_float_param(const at::Tensor& t, const at::Tensor& x, at::IntArrayRef sizes) {
  return t.defined() && t.device() == x.device() && t.scalar_type() == at::kFloat && t.sizes() == sizes;
}

template <class input_t>
Args<input_t> args_of(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                      const at::Tensor& b2) {
  Args<input_t> a{x.const_data_ptr<input_t>(), w1.const_data_ptr<float>(), b1.const_data_ptr<float>(),
                  w2.const_data_ptr<float>(), b2.const_data_ptr<float>(), {}, {}, b1.stride(0), b2.stride(0)};
  for (int d = 0; d < 4; ++d) a.w1_stride[d] = w1.stride(d), a.w2_stride[d] = w2.stride(d);
  return a;
}

// Calls fn with scalar_t (the autocast dtype) and input_t (the images' dtype: float or scalar_t).
template <class Fn>
void dispatch(at::ScalarType dtype, at::ScalarType input, Fn&& fn) {
  auto with_input = [&](auto scalar) {
    using scalar_t = decltype(scalar);
    if (input == at::kFloat) fn(scalar, float{});
    else fn(scalar, scalar);
  };
  if (dtype == at::kBFloat16) with_input(c10::BFloat16{});
  else with_input(c10::Half{});
}

template <class Kernel>
void allow_shared_memory(Kernel kernel, int bytes) {
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

}  // namespace

bool mnist_features_supported(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                              const at::Tensor& b2, at::ScalarType dtype) {
  if (!x.is_cuda() || (dtype != at::kBFloat16 && dtype != at::kHalf)) return false;
  if (x.scalar_type() != at::kFloat && x.scalar_type() != dtype) return false;
  const bool dense_images = x.dim() == 4 && x.size(1) == 1 && x.size(2) == kImage && x.size(3) == kImage &&
                            x.stride(3) == 1 && x.stride(2) == kImage &&
                            (x.size(0) == 1 || x.stride(0) == kImage * kImage) && x.size(0) >= 1 &&
                            x.size(0) <= (int64_t{1} << 24);
  const bool params = is_float_param(w1, x, {kC1, 1, 3, 3}) && is_float_param(b1, x, {kC1}) &&
                      is_float_param(w2, x, {kC2, kC1, 3, 3}) && is_float_param(b2, x, {kC2}) &&
                      (w2.is_contiguous() || w2.is_contiguous(at::MemoryFormat::ChannelsLast));
  if (!dense_images || !params) return false;
  const cudaDeviceProp* props = at::cuda::getDeviceProperties(x.device().index());
  return props->major >= 8 && static_cast<int64_t>(props->sharedMemPerBlockOptin) >= kBackwardBytes;
}

MnistFeatures mnist_features_forward(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1,
                                     const at::Tensor& w2, const at::Tensor& b2, at::ScalarType dtype, double p) {
  TORCH_CHECK(mnist_features_supported(x, w1, b1, w2, b2, dtype), "amplab mnist_features: unsupported input");
  TORCH_CHECK(p >= 0 && p < 1, "amplab mnist_features: dropout's p must be in [0, 1), got ", p);
  c10::cuda::CUDAGuard guard(x.device());
  const int64_t n = x.size(0);
  MnistFeatures out{at::empty({n, kC2, kPooled, kPooled}, x.options().dtype(dtype)),
                    at::empty({n, kC2, kPooled, kPooled}, x.options().dtype(at::kByte))};
  at::PhiloxCudaState philox;
  if (p > 0) philox = philox_state_for_dropout(x.device());
  dispatch(dtype, x.scalar_type(), [&](auto scalar, auto input) {
    using scalar_t = decltype(scalar);
    using input_t = decltype(input);
    auto kernel = features_forward_kernel<scalar_t, input_t>;
    allow_shared_memory(kernel, kForwardBytes);
    kernel<<<n, kThreads, kForwardBytes, at::cuda::getCurrentCUDAStream()>>>(
        args_of<input_t>(x, w1, b1, w2, b2), out.y.mutable_data_ptr<scalar_t>(), out.route.mutable_data_ptr<uint8_t>(),
        static_cast<float>(1.0 - p), philox);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

MnistFeatureGrads mnist_features_backward(const at::Tensor& grad_y_any, const at::Tensor& route, const at::Tensor& x,
                                          const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                                          const at::Tensor& b2, at::ScalarType dtype, double p) {
  c10::cuda::CUDAGuard guard(x.device());
  const int64_t n = x.size(0);
  TORCH_CHECK(grad_y_any.sizes() == route.sizes() && grad_y_any.scalar_type() == dtype && route.is_contiguous(),
              "amplab mnist_features: gradient of the wrong shape or dtype");
  at::Tensor grad_y = grad_y_any.contiguous();
  if (reinterpret_cast<uintptr_t>(grad_y.const_data_ptr()) % 16 != 0) grad_y = grad_y.clone();  // read in 16-byte vectors
  at::Tensor partial = at::empty({n, kPartial}, x.options().dtype(at::kFloat));
  MnistFeatureGrads grads{at::empty_like(w1), at::empty_like(b1), at::empty_like(w2), at::empty_like(b2)};
  GradOut out{grads.w1.mutable_data_ptr<float>(), grads.b1.mutable_data_ptr<float>(), grads.w2.mutable_data_ptr<float>(),
              grads.b2.mutable_data_ptr<float>(), {}, {}, grads.b1.stride(0), grads.b2.stride(0)};
  for (int d = 0; d < 4; ++d) out.w1_stride[d] = grads.w1.stride(d), out.w2_stride[d] = grads.w2.stride(d);
  dispatch(dtype, x.scalar_type(), [&](auto scalar, auto input) {
    using scalar_t = decltype(scalar);
    using input_t = decltype(input);
    auto kernel = features_backward_kernel<scalar_t, input_t>;
    allow_shared_memory(kernel, kBackwardBytes);
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    kernel<<<n, kThreads, kBackwardBytes, stream>>>(args_of<input_t>(x, w1, b1, w2, b2), grad_y.const_data_ptr<scalar_t>(),
                                                    route.const_data_ptr<uint8_t>(), 1.f / static_cast<float>(1.0 - p),
                                                    partial.mutable_data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    sum_over_images_kernel<scalar_t><<<(kPartial + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
        partial.const_data_ptr<float>(), static_cast<int>(n), out);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return grads;
}

}  // namespace amplab::cuda
