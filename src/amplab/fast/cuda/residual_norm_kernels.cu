#include "amplab/fast/cuda/residual_norm_kernels.hpp"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros_like.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <type_traits>

#include "amplab/fast/cuda/philox_dropout.cuh"

namespace amplab::cuda {

namespace {

constexpr int kWarps = 8;  // rows per block of 256 threads: one warp per row
constexpr int kLanes = 32;

// Lane `lane` holds quad q of a row: columns 4 * (32 q + lane) .. + 3, so that a warp's loads of
// one quad are one contiguous stretch of the row.
__device__ __forceinline__ int column(int q, int lane) { return 4 * (kLanes * q + lane); }

template <class T>
struct alignas(sizeof(T) * 4) Quad {
  T v[4];
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = kLanes / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// sum = x + dropout(branch); normed = layer_norm(sum) * weight. Row `row` is warp `row % kWarps`
// of block `row / kWarps`; block 0 also writes the Philox seed and offset for the backward.
template <int kQuads, class scalar_t>
__global__ void __launch_bounds__(kWarps* kLanes)
    forward_kernel(const float* __restrict__ x, const scalar_t* __restrict__ branch, const float* __restrict__ weight,
                   float* __restrict__ sum, scalar_t* __restrict__ normed, float* __restrict__ mean_out,
                   float* __restrict__ rstd_out, int64_t rows, float keep, float eps, at::PhiloxCudaState philox,
                   int64_t* __restrict__ philox_out) {
  constexpr int C = kQuads * 4 * kLanes;
  const int lane = threadIdx.x % kLanes;
  const int64_t row = int64_t{blockIdx.x} * kWarps + threadIdx.x / kLanes;
  const bool dropout = keep < 1.f;
  uint64_t seed = 0, offset = 0;
  if (dropout) {
    philox_seed_offset(philox, seed, offset);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      philox_out[0] = static_cast<int64_t>(seed);
      philox_out[1] = static_cast<int64_t>(offset);
    }
  }
  if (row >= rows) return;
  const float scale = dropout ? 1.f / keep : 1.f;
  float v[kQuads][4];
  float total = 0.f;
#pragma unroll
  for (int q = 0; q < kQuads; ++q) {
    const int64_t at = row * C + column(q, lane);
    const float4 xv = x != nullptr ? *reinterpret_cast<const float4*>(x + at) : make_float4(0.f, 0.f, 0.f, 0.f);
    const Quad<scalar_t> b = *reinterpret_cast<const Quad<scalar_t>*>(branch + at);
    bool kept[4] = {true, true, true, true};
    if (dropout) keep4(seed, offset, static_cast<uint64_t>(at / 4), keep, kept);
    const float xs[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      // dropout's output is rounded to the branch's dtype, then added in float (PyTorch's order)
      const float dropped = kept[j] ? static_cast<float>(static_cast<scalar_t>(static_cast<float>(b.v[j]) * scale)) : 0.f;
      v[q][j] = xs[j] + dropped;
      total += v[q][j];
    }
    *reinterpret_cast<float4*>(sum + at) = make_float4(v[q][0], v[q][1], v[q][2], v[q][3]);
  }
  const float mean = warp_sum(total) / C;
  float squares = 0.f;
#pragma unroll
  for (int q = 0; q < kQuads; ++q)
#pragma unroll
    for (int j = 0; j < 4; ++j) squares += (v[q][j] - mean) * (v[q][j] - mean);
  const float rstd = rsqrtf(warp_sum(squares) / C + eps);
#pragma unroll
  for (int q = 0; q < kQuads; ++q) {
    const int c = column(q, lane);
    const float4 w = *reinterpret_cast<const float4*>(weight + c);
    const float ws[4] = {w.x, w.y, w.z, w.w};
    Quad<scalar_t> out;
#pragma unroll
    for (int j = 0; j < 4; ++j) out.v[j] = static_cast<scalar_t>((v[q][j] - mean) * rstd * ws[j]);
    *reinterpret_cast<Quad<scalar_t>*>(normed + row * C + c) = out;
  }
  if (lane == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// The gradients of x, branch and (per block, summed over its rows) weight. LayerNorm's backward:
// with g = grad_normed * weight and xhat the normalized sum,
//   grad_sum += rstd * (g - mean(g) - xhat * mean(g * xhat)),  grad_x = grad_sum,
//   grad_branch = the kept elements' grad_sum / keep (the forward's mask, drawn again).
template <int kQuads, class scalar_t>
__global__ void __launch_bounds__(kWarps* kLanes)
    backward_kernel(const float* __restrict__ grad_sum, const scalar_t* __restrict__ grad_normed,
                    const float* __restrict__ sum, const float* __restrict__ mean_in, const float* __restrict__ rstd_in,
                    const float* __restrict__ weight, const int64_t* __restrict__ philox, float* __restrict__ grad_x,
                    scalar_t* __restrict__ grad_branch, float* __restrict__ partial, int64_t rows, float keep) {
  constexpr int C = kQuads * 4 * kLanes;
  __shared__ float warp_partials[kWarps][C];
  const int lane = threadIdx.x % kLanes, warp = threadIdx.x / kLanes;
  const bool dropout = keep < 1.f;
  const uint64_t seed = dropout ? static_cast<uint64_t>(philox[0]) : 0;
  const uint64_t offset = dropout ? static_cast<uint64_t>(philox[1]) : 0;
  const float scale = dropout ? 1.f / keep : 1.f;
  float w[kQuads][4], grad_w[kQuads][4];
#pragma unroll
  for (int q = 0; q < kQuads; ++q) {
    const float4 wv = *reinterpret_cast<const float4*>(weight + column(q, lane));
    w[q][0] = wv.x, w[q][1] = wv.y, w[q][2] = wv.z, w[q][3] = wv.w;
#pragma unroll
    for (int j = 0; j < 4; ++j) grad_w[q][j] = 0.f;
  }
  for (int64_t row = int64_t{blockIdx.x} * kWarps + warp; row < rows; row += int64_t{gridDim.x} * kWarps) {
    const float mean = mean_in[row], rstd = rstd_in[row];
    float xhat[kQuads][4], g[kQuads][4];
    float g_sum = 0.f, g_xhat_sum = 0.f;
#pragma unroll
    for (int q = 0; q < kQuads; ++q) {
      const int64_t at = row * C + column(q, lane);
      const float4 s = *reinterpret_cast<const float4*>(sum + at);
      const Quad<scalar_t> gn = *reinterpret_cast<const Quad<scalar_t>*>(grad_normed + at);
      const float ss[4] = {s.x, s.y, s.z, s.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float dy = static_cast<float>(gn.v[j]);
        xhat[q][j] = (ss[j] - mean) * rstd;
        g[q][j] = dy * w[q][j];
        g_sum += g[q][j];
        g_xhat_sum += g[q][j] * xhat[q][j];
        grad_w[q][j] += dy * xhat[q][j];
      }
    }
    const float g_mean = warp_sum(g_sum) / C, g_xhat_mean = warp_sum(g_xhat_sum) / C;
#pragma unroll
    for (int q = 0; q < kQuads; ++q) {
      const int64_t at = row * C + column(q, lane);
      float gs[4] = {0.f, 0.f, 0.f, 0.f};
      if (grad_sum != nullptr) {
        const float4 gv = *reinterpret_cast<const float4*>(grad_sum + at);
        gs[0] = gv.x, gs[1] = gv.y, gs[2] = gv.z, gs[3] = gv.w;
      }
      bool kept[4] = {true, true, true, true};
      if (dropout) keep4(seed, offset, static_cast<uint64_t>(at / 4), keep, kept);
      Quad<scalar_t> gb;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        gs[j] += rstd * (g[q][j] - g_mean - xhat[q][j] * g_xhat_mean);
        gb.v[j] = static_cast<scalar_t>(kept[j] ? gs[j] * scale : 0.f);
      }
      if (grad_x != nullptr) *reinterpret_cast<float4*>(grad_x + at) = make_float4(gs[0], gs[1], gs[2], gs[3]);
      *reinterpret_cast<Quad<scalar_t>*>(grad_branch + at) = gb;
    }
  }
  // The block's share of the weight's gradient: its warps' sums added in a fixed order.
#pragma unroll
  for (int q = 0; q < kQuads; ++q)
#pragma unroll
    for (int j = 0; j < 4; ++j) warp_partials[warp][column(q, lane) + j] = grad_w[q][j];
  __syncthreads();
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float total = 0.f;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) total += warp_partials[k][c];
    partial[int64_t{blockIdx.x} * C + c] = total;
  }
}

// grad_weight[c] = the sum over blocks of partial[b][c], in a fixed order (deterministic). A block
// takes 32 columns: each of its 8 warps reads rows w, w + 8, ... (a warp's 32 loads one coalesced
// line), then the 8 sums are added in warp order.
constexpr int kSumColumns = 32, kSumRowGroups = 8;
__global__ void __launch_bounds__(kSumColumns* kSumRowGroups)
    sum_columns_kernel(const float* __restrict__ partial, int64_t rows, int columns, float* __restrict__ out) {
  __shared__ float sums[kSumRowGroups][kSumColumns];
  const int lane = threadIdx.x % kSumColumns, group = threadIdx.x / kSumColumns;
  const int c = blockIdx.x * kSumColumns + lane;
  float total = 0.f;
  if (c < columns)
    for (int64_t b = group; b < rows; b += kSumRowGroups) total += partial[b * columns + c];
  sums[group][lane] = total;
  __syncthreads();
  if (group == 0 && c < columns) {
    float sum = 0.f;
#pragma unroll
    for (int g = 0; g < kSumRowGroups; ++g) sum += sums[g][lane];
    out[c] = sum;
  }
}

// Calls f with the kernel's element type for `dtype` (float, bfloat16, half).
template <class F>
void with_scalar_type(at::ScalarType dtype, F&& f) {
  switch (dtype) {
    case at::kFloat: return f(float{});
    case at::kBFloat16: return f(at::BFloat16{});
    case at::kHalf: return f(at::Half{});
    default: TORCH_CHECK(false, "dropout_add_layer_norm: no kernel for ", dtype);
  }
}

// Calls f with std::integral_constant<int, quads> for the quads a lane holds (C / 128).
template <class F>
void with_quads(int64_t quads, F&& f) {
  switch (quads) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 8: return f(std::integral_constant<int, 8>{});
    default: TORCH_CHECK(false, "dropout_add_layer_norm: no kernel for rows of ", quads * 128);
  }
}

bool aligned(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

}  // namespace

bool dropout_add_layer_norm_supported(const at::Tensor& x, const at::Tensor& branch, const at::Tensor& weight) {
  if (!branch.defined() || !weight.defined()) return false;
  const auto b = branch.scalar_type();
  if (!branch.is_cuda() || !branch.is_contiguous() || branch.dim() < 1 || branch.numel() == 0 ||
      (b != at::kFloat && b != at::kBFloat16 && b != at::kHalf) || !aligned(branch))
    return false;
  if (x.defined() && (x.device() != branch.device() || x.scalar_type() != at::kFloat || x.sizes() != branch.sizes() ||
                      !x.is_contiguous() || !aligned(x)))
    return false;
  const int64_t C = branch.size(-1), quads = C / 128;
  if (C % 128 != 0 || quads > 8 || quads == 5 || quads == 7) return false;
  return weight.device() == branch.device() && weight.scalar_type() == at::kFloat && weight.dim() == 1 &&
         weight.size(0) == C && weight.is_contiguous() && aligned(weight);
}

ResidualNormSaved dropout_add_layer_norm_forward(const at::Tensor& x, const at::Tensor& branch, const at::Tensor& weight,
                                                 double p, double eps) {
  TORCH_CHECK(dropout_add_layer_norm_supported(x, branch, weight), "dropout_add_layer_norm: tensors it cannot take");
  TORCH_CHECK(p >= 0 && p < 1, "dropout_add_layer_norm: p must be in [0, 1), got ", p);
  c10::cuda::CUDAGuard guard(branch.device());
  const int64_t C = branch.size(-1), rows = branch.numel() / C;
  const auto floats = branch.options().dtype(at::kFloat);
  ResidualNormSaved s{at::empty_like(branch, floats), at::empty_like(branch), at::empty({rows}, floats),
                      at::empty({rows}, floats), at::empty({2}, branch.options().dtype(at::kLong))};
  at::PhiloxCudaState philox;
  if (p > 0) philox = philox_state_for_dropout(branch.device());
  const auto blocks = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  with_scalar_type(branch.scalar_type(), [&](auto type) {
    using scalar_t = decltype(type);
    with_quads(C / 128, [&](auto quads) {
      forward_kernel<decltype(quads)::value, scalar_t><<<blocks, kWarps * kLanes, 0, stream>>>(
          x.defined() ? x.data_ptr<float>() : nullptr, branch.data_ptr<scalar_t>(), weight.data_ptr<float>(), s.sum.data_ptr<float>(),
          s.normed.data_ptr<scalar_t>(), s.mean.data_ptr<float>(), s.rstd.data_ptr<float>(), rows,
          static_cast<float>(1.0 - p), static_cast<float>(eps), philox, s.philox.data_ptr<int64_t>());
    });
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return s;
}

ResidualNormGrads dropout_add_layer_norm_backward(const at::Tensor& grad_sum, const at::Tensor& grad_normed,
                                                  const ResidualNormSaved& saved, const at::Tensor& weight, double p,
                                                  bool x_needs_grad) {
  c10::cuda::CUDAGuard guard(saved.sum.device());
  const int64_t C = saved.sum.size(-1), rows = saved.sum.numel() / C;
  const auto dtype = grad_normed.defined() ? grad_normed.scalar_type() : saved.normed.scalar_type();
  // (a gradient's view may start off 16 bytes: then a copy that does not)
  at::Tensor dy = grad_normed.defined() ? grad_normed.contiguous() : at::zeros_like(saved.sum, saved.sum.options().dtype(dtype));
  if (!aligned(dy)) dy = dy.clone();
  at::Tensor ds = grad_sum.defined() ? grad_sum.to(at::kFloat).contiguous() : at::Tensor();
  if (ds.defined() && !aligned(ds)) ds = ds.clone();
  ResidualNormGrads g{x_needs_grad ? at::empty_like(saved.sum) : at::Tensor(), at::empty_like(dy), at::Tensor()};
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  at::Tensor partial;  // (blocks, C): each block's share of the weight's gradient
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  with_scalar_type(dtype, [&](auto type) {
    using scalar_t = decltype(type);
    with_quads(C / 128, [&](auto quads) {
      auto* kernel = backward_kernel<decltype(quads)::value, scalar_t>;
      // as many blocks as the GPU holds at once, each walking its rows: fewer partial sums
      static const int per_sm = [kernel] {
        int n = 1;
        C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kWarps * kLanes, 0));
        return n;
      }();
      const auto blocks =
          static_cast<unsigned>(std::min<int64_t>((rows + kWarps - 1) / kWarps, int64_t{std::max(per_sm, 1)} * sms));
      partial = at::empty({static_cast<int64_t>(blocks), C}, saved.sum.options());
      kernel<<<blocks, kWarps * kLanes, 0, stream>>>(
          ds.defined() ? ds.data_ptr<float>() : nullptr, dy.data_ptr<scalar_t>(), saved.sum.data_ptr<float>(),
          saved.mean.data_ptr<float>(), saved.rstd.data_ptr<float>(), weight.data_ptr<float>(),
          saved.philox.data_ptr<int64_t>(), g.x.defined() ? g.x.data_ptr<float>() : nullptr, g.branch.data_ptr<scalar_t>(),
          partial.data_ptr<float>(), rows, static_cast<float>(1.0 - p));
    });
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  g.weight = at::empty({C}, saved.sum.options());
  sum_columns_kernel<<<static_cast<unsigned>((C + kSumColumns - 1) / kSumColumns), kSumColumns * kSumRowGroups, 0, stream>>>(
      partial.data_ptr<float>(), partial.size(0), static_cast<int>(C), g.weight.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return g;
}

}  // namespace amplab::cuda
