#include "amplab/fast/cuda/mnist_head_kernels.hpp"

#include <ATen/NumericUtils.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>

#include "amplab/fast/cuda/philox_dropout.cuh"

namespace amplab::cuda {

namespace {

constexpr int kHidden = 128;  // fc1's outputs: four per lane
constexpr int kClasses = 10;
constexpr int kLanes = 32;
constexpr int kWarps = 8;  // rows a block takes at a time, one a warp, forward and backward
constexpr int kGradW2 = kClasses * kHidden;
// A share of fc2's weight and bias gradients, padded so that each share starts 16-byte aligned.
constexpr int kPartials = kGradW2 + 16;
// The int64 state the forward hands the backward: the dropout's Philox seed and offset, and the
// backward's count of finished blocks (zeroed by the forward, and by the backward's last block).
constexpr int kSeed = 0, kOffset = 1, kFinishedBlocks = 2, kStateSize = 3;

template <class T>
struct alignas(sizeof(T) * 4) Quad {
  T v[4];
};

template <class scalar_t>
__device__ __forceinline__ float rounded(float v) {
  return static_cast<float>(static_cast<scalar_t>(v));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = kLanes / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

struct Dropout {
  bool on = false;
  float keep = 1.f, scale = 1.f;
  uint64_t seed = 0, offset = 0;
};

__device__ __forceinline__ Dropout make_dropout(float keep) {
  Dropout d;
  d.on = keep < 1.f;
  d.keep = keep;
  d.scale = d.on ? 1.f / keep : 1.f;
  return d;
}

// A lane's four features of row `row` of h (columns 4 lane .. + 3; h_row: the row, in global or
// shared memory): h, whether dropout kept each, and d = dropout(relu(h)) as PyTorch computes it in
// the dtype (ReLU keeps NaN; dropout multiplies by the mask and the scale in float, then rounds).
template <class scalar_t>
__device__ __forceinline__ void lane_features(const scalar_t* h_row, int64_t row, int lane, const Dropout& dropout,
                                              float hv[4], bool kept[4], float d[4]) {
  const Quad<scalar_t> q = *reinterpret_cast<const Quad<scalar_t>*>(h_row + 4 * lane);
#pragma unroll
  for (int k = 0; k < 4; ++k) kept[k] = true;
  if (dropout.on) keep4(dropout.seed, dropout.offset, static_cast<uint64_t>(row * kLanes + lane), dropout.keep, kept);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    hv[k] = static_cast<float>(q.v[k]);
    const float relu = (at::_isnan(hv[k]) || hv[k] > 0.f) ? hv[k] : 0.f;
    d[k] = dropout.on ? rounded<scalar_t>(relu * (kept[k] ? 1.f : 0.f) * dropout.scale) : relu;
  }
}

// fc2's weights for a lane's four features, rounded to the dtype as autocast casts them.
template <class scalar_t>
__device__ __forceinline__ void lane_weights(const float* __restrict__ w2, int lane, float w[kClasses][4]) {
#pragma unroll
  for (int c = 0; c < kClasses; ++c) {
    const float4 v = *reinterpret_cast<const float4*>(w2 + c * kHidden + 4 * lane);
    w[c][0] = rounded<scalar_t>(v.x), w[c][1] = rounded<scalar_t>(v.y);
    w[c][2] = rounded<scalar_t>(v.z), w[c][3] = rounded<scalar_t>(v.w);
  }
}

// log_probs = log_softmax(fc2(dropout(relu(h)))): row `row` is warp `row % kWarps` of block
// `row / kWarps`; block 0 writes the backward's state (kSeed, kOffset, kFinishedBlocks).
template <class scalar_t>
__global__ void __launch_bounds__(kWarps* kLanes)
    head_forward_kernel(const scalar_t* __restrict__ h, const float* __restrict__ w2, const float* __restrict__ b2,
                        float* __restrict__ log_probs, int64_t rows, float keep, at::PhiloxCudaState philox,
                        int64_t* __restrict__ state) {
  const int lane = threadIdx.x % kLanes;
  const int64_t row = int64_t{blockIdx.x} * kWarps + threadIdx.x / kLanes;
  Dropout dropout = make_dropout(keep);
  if (dropout.on) philox_seed_offset(philox, dropout.seed, dropout.offset);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    state[kSeed] = static_cast<int64_t>(dropout.seed);
    state[kOffset] = static_cast<int64_t>(dropout.offset);
    state[kFinishedBlocks] = 0;
  }
  if (row >= rows) return;
  float hv[4], d[4], w[kClasses][4];
  bool kept[4];
  lane_features(h + row * kHidden, row, lane, dropout, hv, kept, d);
  lane_weights<scalar_t>(w2, lane, w);
  float logits[kClasses], largest = -INFINITY;
#pragma unroll
  for (int c = 0; c < kClasses; ++c) {
    const float sum = warp_sum(d[0] * w[c][0] + d[1] * w[c][1] + d[2] * w[c][2] + d[3] * w[c][3]);
    logits[c] = rounded<scalar_t>(sum + rounded<scalar_t>(b2[c]));  // fc2's output is in the dtype
    largest = fmaxf(largest, logits[c]);
  }
  float exp_sum = 0.f;
#pragma unroll
  for (int c = 0; c < kClasses; ++c) exp_sum += expf(logits[c] - largest);
  const float log_sum = logf(exp_sum);
#pragma unroll
  for (int c = 0; c < kClasses; ++c)
    if (lane == c) log_probs[row * kClasses + c] = logits[c] - largest - log_sum;
}

// fc2's gradients from the blocks' sums (partials: `blocks` x kPartials), added in block order by
// one block: thread t takes gradients t, t + blockDim, ..., and loads eight blocks' sums of each at
// once (one wait on L2 per eight blocks, not one per sum).
__device__ __forceinline__ void add_block_sums(const float* __restrict__ partials, unsigned blocks,
                                               float* __restrict__ grad_w2, float* __restrict__ grad_b2) {
  constexpr int kSumsPerThread = (kGradW2 + kClasses + kWarps * kLanes - 1) / (kWarps * kLanes);
  constexpr int kBlocksAtOnce = 8;
  float sums[kSumsPerThread] = {};
  for (unsigned first = 0; first < blocks; first += kBlocksAtOnce) {
    float loaded[kSumsPerThread][kBlocksAtOnce];
#pragma unroll
    for (int j = 0; j < kSumsPerThread; ++j)
#pragma unroll
      for (int b = 0; b < kBlocksAtOnce; ++b) {
        const int i = threadIdx.x + j * kWarps * kLanes;
        const bool there = i < kGradW2 + kClasses && first + b < blocks;
        loaded[j][b] = there ? __ldcg(partials + int64_t{first + b} * kPartials + i) : 0.f;
      }
#pragma unroll
    for (int j = 0; j < kSumsPerThread; ++j)
#pragma unroll
      for (int b = 0; b < kBlocksAtOnce; ++b) sums[j] += loaded[j][b];
  }
#pragma unroll
  for (int j = 0; j < kSumsPerThread; ++j) {
    const int i = threadIdx.x + j * kWarps * kLanes;
    if (i < kGradW2) grad_w2[i] = sums[j];
    else if (i < kGradW2 + kClasses) grad_b2[i - kGradW2] = sums[j];
  }
}

// The gradients of h, w2 and b2 from the gradient of log_probs. Warp `warp` of block `block` takes
// rows block * kWarps + warp, then that plus gridDim * kWarps, ...; a block adds its warps' shares
// of fc2's gradients in warp order and writes the sum to `partials`; the last block to finish adds
// the blocks' sums in block order (the same bits on every run) and zeroes the count again.
template <class scalar_t>
__global__ void __launch_bounds__(kWarps* kLanes)
    head_backward_kernel(const float* __restrict__ grad_log_probs, const float* __restrict__ log_probs,
                         const scalar_t* __restrict__ h, const float* __restrict__ w2, int64_t* __restrict__ state,
                         scalar_t* __restrict__ grad_h, float* __restrict__ partials, float* __restrict__ grad_w2,
                         float* __restrict__ grad_b2, int64_t rows, float keep) {
  __shared__ __align__(16) float warp_partials[kWarps][kPartials];
  __shared__ bool last_block;
  const int lane = threadIdx.x % kLanes, warp = threadIdx.x / kLanes;
  Dropout dropout = make_dropout(keep);
  if (dropout.on) dropout.seed = static_cast<uint64_t>(state[kSeed]), dropout.offset = static_cast<uint64_t>(state[kOffset]);
  float w[kClasses][4], gw[kClasses][4] = {}, gb[kClasses] = {};
  lane_weights<scalar_t>(w2, lane, w);
  for (int64_t row = int64_t{blockIdx.x} * kWarps + warp; row < rows; row += int64_t{gridDim.x} * kWarps) {
    // log-softmax's backward, g - exp(log_probs) * sum(g), rounded to the dtype of fc2's output:
    // lane c < kClasses computes class c's, then every lane gets them all
    const float go = lane < kClasses ? grad_log_probs[row * kClasses + lane] : 0.f;
    const float lp = lane < kClasses ? log_probs[row * kClasses + lane] : 0.f;
    float hv[4], d[4];
    bool kept[4];
    lane_features(h + row * kHidden, row, lane, dropout, hv, kept, d);
    const float mine = rounded<scalar_t>(go - expf(lp) * warp_sum(go));
    float g_logits[kClasses];
#pragma unroll
    for (int c = 0; c < kClasses; ++c) g_logits[c] = __shfl_sync(0xffffffffu, mine, c);
    Quad<scalar_t> g_h;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float g_d = 0.f;  // fc2's input gradient (a product in the dtype)
#pragma unroll
      for (int c = 0; c < kClasses; ++c) g_d += g_logits[c] * w[c][k];
      g_d = rounded<scalar_t>(g_d);
      const float g_relu = dropout.on ? rounded<scalar_t>(g_d * (kept[k] ? 1.f : 0.f) * dropout.scale) : g_d;
      g_h.v[k] = static_cast<scalar_t>(hv[k] <= 0.f ? 0.f : g_relu);  // threshold_backward: not where relu(h) <= 0
#pragma unroll
      for (int c = 0; c < kClasses; ++c) gw[c][k] += g_logits[c] * d[k];
    }
    *reinterpret_cast<Quad<scalar_t>*>(grad_h + row * kHidden + 4 * lane) = g_h;
#pragma unroll
    for (int c = 0; c < kClasses; ++c) gb[c] += g_logits[c];
  }
#pragma unroll
  for (int c = 0; c < kClasses; ++c) {
    *reinterpret_cast<float4*>(&warp_partials[warp][c * kHidden + 4 * lane]) =
        make_float4(gw[c][0], gw[c][1], gw[c][2], gw[c][3]);
    if (lane == 0) warp_partials[warp][kGradW2 + c] = gb[c];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kGradW2 + kClasses; i += blockDim.x) {
    float sum = 0.f;
#pragma unroll
    for (int from = 0; from < kWarps; ++from) sum += warp_partials[from][i];
    partials[int64_t{blockIdx.x} * kPartials + i] = sum;
  }
  // The last block to get here adds the blocks' sums (CUDA's threadFenceReduction pattern).
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    auto* finished = reinterpret_cast<unsigned long long*>(state + kFinishedBlocks);
    last_block = atomicAdd(finished, 1ull) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  add_block_sums(partials, gridDim.x, grad_w2, grad_b2);
  if (threadIdx.x == 0) state[kFinishedBlocks] = 0;  // for another backward of the same forward
}

// Calls f with the kernel's element type for `dtype` (bfloat16 or half).
template <class F>
void with_scalar_type(at::ScalarType dtype, F&& f) {
  switch (dtype) {
    case at::kBFloat16: return f(at::BFloat16{});
    case at::kHalf: return f(at::Half{});
    default: TORCH_CHECK(false, "mnist_head: no kernel for ", dtype);
  }
}

bool aligned(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

}  // namespace

bool mnist_head_supported(const at::Tensor& h, const at::Tensor& w2, const at::Tensor& b2) {
  if (!h.defined() || !w2.defined() || !b2.defined() || !h.is_cuda()) return false;
  if (h.scalar_type() != at::kBFloat16 && h.scalar_type() != at::kHalf) return false;
  if (h.dim() != 2 || h.size(0) == 0 || h.size(1) != kHidden || !h.is_contiguous() || !aligned(h)) return false;
  if (w2.device() != h.device() || w2.scalar_type() != at::kFloat || w2.dim() != 2 || w2.size(0) != kClasses ||
      w2.size(1) != kHidden || !w2.is_contiguous() || !aligned(w2))
    return false;
  return b2.device() == h.device() && b2.scalar_type() == at::kFloat && b2.dim() == 1 && b2.size(0) == kClasses &&
         b2.is_contiguous();
}

MnistHead mnist_head_forward(const at::Tensor& h, const at::Tensor& w2, const at::Tensor& b2, double p) {
  TORCH_CHECK(mnist_head_supported(h, w2, b2), "mnist_head: tensors it cannot take");
  TORCH_CHECK(p >= 0 && p < 1, "mnist_head: dropout's p must be in [0, 1), got ", p);
  c10::cuda::CUDAGuard guard(h.device());
  const int64_t rows = h.size(0);
  MnistHead out{at::empty({rows, kClasses}, w2.options()), at::empty({kStateSize}, h.options().dtype(at::kLong))};
  at::PhiloxCudaState philox;
  if (p > 0) philox = philox_state_for_dropout(h.device());
  const auto blocks = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
  with_scalar_type(h.scalar_type(), [&](auto type) {
    using scalar_t = decltype(type);
    head_forward_kernel<scalar_t><<<blocks, kWarps * kLanes, 0, at::cuda::getCurrentCUDAStream()>>>(
        h.data_ptr<scalar_t>(), w2.data_ptr<float>(), b2.data_ptr<float>(), out.log_probs.data_ptr<float>(), rows,
        static_cast<float>(1.0 - p), philox, out.state.data_ptr<int64_t>());
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

MnistHeadGrads mnist_head_backward(const at::Tensor& grad_log_probs, const MnistHead& saved, const at::Tensor& h,
                                   const at::Tensor& w2, double p) {
  c10::cuda::CUDAGuard guard(h.device());
  const int64_t rows = h.size(0);
  TORCH_CHECK(grad_log_probs.dim() == 2 && grad_log_probs.size(0) == rows && grad_log_probs.size(1) == kClasses,
              "mnist_head: the gradient must be (", rows, ", ", kClasses, "), got ", grad_log_probs.sizes());
  const at::Tensor g = grad_log_probs.to(at::kFloat).contiguous();
  MnistHeadGrads grads{at::empty_like(h), at::empty_like(w2), at::empty({kClasses}, w2.options())};
  // as many blocks as rows allow, up to two a multiprocessor (each walks its rows)
  const int sms = at::cuda::getDeviceProperties(h.device().index())->multiProcessorCount;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((rows + kWarps - 1) / kWarps, 2 * int64_t{sms}));
  const at::Tensor partials = at::empty({static_cast<int64_t>(blocks), kPartials}, w2.options());
  with_scalar_type(h.scalar_type(), [&](auto type) {
    using scalar_t = decltype(type);
    head_backward_kernel<scalar_t><<<blocks, kWarps * kLanes, 0, at::cuda::getCurrentCUDAStream()>>>(
        g.data_ptr<float>(), saved.log_probs.data_ptr<float>(), h.data_ptr<scalar_t>(), w2.data_ptr<float>(),
        saved.state.data_ptr<int64_t>(), grads.h.data_ptr<scalar_t>(), partials.data_ptr<float>(),
        grads.w2.data_ptr<float>(), grads.b2.data_ptr<float>(), rows, static_cast<float>(1.0 - p));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return grads;
}

}  // namespace amplab::cuda
