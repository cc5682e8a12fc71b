#include "amplab/fast/cuda/layer_kernels.hpp"

#include <ATen/Dispatch.h>
#include <ATen/NumericUtils.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>

#include "amplab/fast/cuda/bias_relu.cuh"

namespace amplab::cuda {

namespace {

constexpr int kThreads = 256;

// The sizes a kernel works with: the input's batch, height and width, and the channels (the
// pool's input channels, the convolution's output channels).
struct ImageShape {
  int n, h, w;
  int channels;
  __host__ __device__ int pooled_h() const { return h / 2; }  // 2x2 pool: h and w even
  __host__ __device__ int pooled_w() const { return w / 2; }
  __host__ __device__ int out_rows() const { return n * (h - 2) * (w - 2); }  // 3x3 convolution's outputs
};

// ---- the sums of the backward passes --------------------------------------------------------------

// The sum over blocks of partial[b][j], in a fixed order (deterministic): one block per column j,
// a tree over its threads. Columns come per channel, `weights` weight sums then the bias sum:
// column c * (weights + 1) + k goes to grad_weight[c * weights + k] for k < weights, else to
// grad_bias[c].
template <class scalar_t>
__global__ void sum_partials_kernel(const float* __restrict__ partial, int blocks, int columns, int weights,
                                    scalar_t* __restrict__ grad_weight, scalar_t* __restrict__ grad_bias) {
  __shared__ float sums[kThreads];
  const int j = blockIdx.x;
  float acc = 0.f;
  for (int b = threadIdx.x; b < blocks; b += blockDim.x) acc += partial[b * int64_t{columns} + j];
  sums[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) sums[threadIdx.x] += sums[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const int c = j / (weights + 1), k = j % (weights + 1);
    (k < weights ? grad_weight[c * weights + k] : grad_bias[c]) = static_cast<scalar_t>(sums[0]);
  }
}

// ---- bias + ReLU + 2x2 max-pool (NHWC in, NCHW out) ----------------------------------------------


// Window (n, ph, pw) of channel c after bias and ReLU: where its four inputs are, and which one the
// pool takes. PyTorch scans rows then columns and moves on when a value is greater or NaN.
template <class scalar_t>
struct Window {
  int64_t first;  // index of the window's top-left input
  int arg;        // 0..3: top-left, top-right, bottom-left, bottom-right
  scalar_t best;

  __device__ __forceinline__ Window(const scalar_t* __restrict__ x, scalar_t b, const ImageShape& s, int n, int ph, int pw,
                                    int c) {
    first = ((int64_t{n} * s.h + 2 * ph) * s.w + 2 * pw) * s.channels + c;
    float best_value = -INFINITY;
    arg = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const scalar_t v = add_relu(x[offset(k, s)], b);
      const float f = static_cast<float>(v);
      if (f > best_value || at::_isnan(f)) {
        best_value = f;
        best = v;
        arg = k;
      }
    }
  }
  __device__ __forceinline__ int64_t offset(int k, const ImageShape& s) const {
    return first + (int64_t{k / 2} * s.w + k % 2) * s.channels;
  }
};

// One block per pooled row (n, ph). Windows are taken channel-fastest (x is NHWC: coalesced reads);
// their maxima wait in shared memory as [c][pw] and go out as rows of y[n][c][ph][:] (NCHW, so
// that the flatten after the pool is a view, not a copy).
template <class scalar_t>
__global__ void pool_forward_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ bias,
                                    scalar_t* __restrict__ y, ImageShape s) {
  extern __shared__ unsigned char shared[];
  scalar_t* tile = reinterpret_cast<scalar_t*>(shared);  // [channels][pooled_w]
  const int n = blockIdx.x / s.pooled_h(), ph = blockIdx.x % s.pooled_h();
  const int outputs = s.pooled_w() * s.channels;
  for (int i = threadIdx.x; i < outputs; i += blockDim.x) {
    const int c = i % s.channels, pw = i / s.channels;
    tile[c * s.pooled_w() + pw] = Window<scalar_t>(x, bias[c], s, n, ph, pw, c).best;
  }
  __syncthreads();
  scalar_t* row = y + (int64_t{n} * s.channels * s.pooled_h() + ph) * s.pooled_w();  // &y[n][0][ph][0]
  for (int i = threadIdx.x; i < outputs; i += blockDim.x) {
    const int c = i / s.pooled_w(), pw = i % s.pooled_w();
    row[int64_t{c} * s.pooled_h() * s.pooled_w() + pw] = tile[i];
  }
}

// The same blocks: the pooled row's gradients (NCHW) come in through shared memory, then each
// window sends its gradient to its maximum if ReLU let it through, zeros elsewhere. Thread t keeps
// channel t % channels (channels divide the block) and sums its gradients for the bias;
// partial[block][c] holds the block's sums.
template <class scalar_t>
__global__ void pool_backward_kernel(const scalar_t* __restrict__ grad_y, const scalar_t* __restrict__ x,
                                     const scalar_t* __restrict__ bias, scalar_t* __restrict__ grad_x,
                                     float* __restrict__ partial, ImageShape s) {
  extern __shared__ unsigned char shared[];
  scalar_t* tile = reinterpret_cast<scalar_t*>(shared);  // [channels][pooled_w]
  __shared__ float sums[kThreads];
  const int n = blockIdx.x / s.pooled_h(), ph = blockIdx.x % s.pooled_h();
  const int outputs = s.pooled_w() * s.channels;
  const scalar_t* row = grad_y + (int64_t{n} * s.channels * s.pooled_h() + ph) * s.pooled_w();
  for (int i = threadIdx.x; i < outputs; i += blockDim.x) {
    const int c = i / s.pooled_w(), pw = i % s.pooled_w();
    tile[i] = row[int64_t{c} * s.pooled_h() * s.pooled_w() + pw];
  }
  __syncthreads();
  const scalar_t zero = static_cast<scalar_t>(0.f);
  const int c = threadIdx.x % s.channels;
  const scalar_t b = bias[c];
  float acc = 0.f;
  for (int i = threadIdx.x; i < outputs; i += blockDim.x) {
    const int pw = i / s.channels;
    Window<scalar_t> window(x, b, s, n, ph, pw, c);
    const scalar_t g_in = passes(window.best) ? tile[c * s.pooled_w() + pw] : zero;
#pragma unroll
    for (int k = 0; k < 4; ++k) grad_x[window.offset(k, s)] = k == window.arg ? g_in : zero;
    acc += static_cast<float>(g_in);
  }
  sums[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x < s.channels) {
    float total = 0.f;
    for (int k = 0; k < static_cast<int>(blockDim.x) / s.channels; ++k) total += sums[k * s.channels + threadIdx.x];
    partial[blockIdx.x * int64_t{s.channels} + threadIdx.x] = total;
  }
}

// ---- 3x3 convolution of a one-channel image + bias + ReLU (NHWC out) ----------------------------

// y = relu(conv2d(x, w) + b) for x (N, 1, H, W) dense, w (C, 1, 3, 3), stride 1, no padding: y is
// (N, C, H-2, W-2) channels-last. Products and their sum in float (ky, kx order), rounded to
// scalar_t as a convolution's output is, then bias and ReLU as add_relu. x may be float (the
// images autocast would cast): it is rounded to scalar_t first, as the cast would.

// The nine inputs under output position `row` (n, oh, ow), ky then kx, rounded to scalar_t.
template <class scalar_t, class input_t>
__device__ __forceinline__ void window3x3(const input_t* __restrict__ x, const ImageShape& s, int row, float (&xs)[9]) {
  const int ow = row % (s.w - 2);
  const int oh = (row / (s.w - 2)) % (s.h - 2);
  const int n = row / ((s.w - 2) * (s.h - 2));
  const input_t* top_left = x + (int64_t{n} * s.h + oh) * s.w + ow;
#pragma unroll
  for (int k = 0; k < 9; ++k) xs[k] = static_cast<float>(static_cast<scalar_t>(top_left[(k / 3) * s.w + k % 3]));
}

// A thread computes kConvGroup channels of one output position: the nine inputs are read once
// for all of them, and a warp writes whole rows of channels. Weights and bias wait in shared
// memory (dynamic, channels * 10 floats).
constexpr int kConvGroup = 8;

template <class scalar_t, class input_t>
__global__ void conv3x3_forward_kernel(const input_t* __restrict__ x, const scalar_t* __restrict__ weight,
                                       const scalar_t* __restrict__ bias, scalar_t* __restrict__ y, ImageShape s) {
  extern __shared__ float weights_and_bias[];  // [channels * 9] weights, then [channels] bias
  float* w = weights_and_bias;
  float* b = weights_and_bias + s.channels * 9;
  for (int i = threadIdx.x; i < s.channels * 10; i += blockDim.x)
    weights_and_bias[i] = static_cast<float>(i < s.channels * 9 ? weight[i] : bias[i - s.channels * 9]);
  __syncthreads();
  const int groups = s.channels / kConvGroup;
  const int64_t work = int64_t{s.out_rows()} * groups;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < work; t += int64_t{gridDim.x} * blockDim.x) {
    const int row = static_cast<int>(t / groups);
    const int first_channel = static_cast<int>(t % groups) * kConvGroup;
    float xs[9];
    window3x3<scalar_t>(x, s, row, xs);
#pragma unroll
    for (int j = 0; j < kConvGroup; ++j) {
      const int c = first_channel + j;
      float acc = 0.f;
#pragma unroll
      for (int k = 0; k < 9; ++k) acc += xs[k] * w[c * 9 + k];
      y[int64_t{row} * s.channels + c] = add_relu(static_cast<scalar_t>(acc), static_cast<scalar_t>(b[c]));
    }
  }
}

// partial[block][c * 10 + k]: the block's sums of the weight gradient (k < 9) and the bias
// gradient (k = 9) of channel c. A thread takes kConvBackwardGroup channels of one position at a
// time and keeps their 40 sums (few enough registers for 3 blocks per SM); lanes of a warp with the
// same channels then add theirs (shuffles), and the block adds its warps' (dynamic shared memory:
// warps * channels * 10 floats). Few blocks, each looping over many positions: the sums at the end
// cost the same per block however many positions it took.
constexpr int kConvBackwardGroup = 4;
template <class scalar_t, class input_t>
__global__ void conv3x3_backward_kernel(const scalar_t* __restrict__ grad_y, const scalar_t* __restrict__ y,
                                        const input_t* __restrict__ x, float* __restrict__ partial, ImageShape s) {
  extern __shared__ float warp_sums[];  // [warps][channels * 10]
  const int groups = s.channels / kConvBackwardGroup;  // divides 32: a thread's channels stay the same
  const int first_channel = (threadIdx.x % groups) * kConvBackwardGroup;
  float acc[kConvBackwardGroup][10] = {};
  const int64_t work = int64_t{s.out_rows()} * groups;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < work; t += int64_t{gridDim.x} * blockDim.x) {
    const int row = static_cast<int>(t / groups);
    float xs[9];
    window3x3<scalar_t>(x, s, row, xs);
#pragma unroll
    for (int j = 0; j < kConvBackwardGroup; ++j) {
      const int64_t i = int64_t{row} * s.channels + first_channel + j;
      const float g = passes(y[i]) ? static_cast<float>(grad_y[i]) : 0.f;  // through the ReLU
#pragma unroll
      for (int k = 0; k < 9; ++k) acc[j][k] += g * xs[k];
      acc[j][9] += g;
    }
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int j = 0; j < kConvBackwardGroup; ++j)
#pragma unroll
    for (int k = 0; k < 10; ++k) {
      for (int offset = groups; offset < 32; offset *= 2) acc[j][k] += __shfl_xor_sync(0xffffffffu, acc[j][k], offset);
      if (lane < groups) warp_sums[warp * s.channels * 10 + (first_channel + j) * 10 + k] = acc[j][k];
    }
  __syncthreads();
  for (int j = threadIdx.x; j < s.channels * 10; j += blockDim.x) {
    float total = 0.f;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += warp_sums[w * s.channels * 10 + j];
    partial[blockIdx.x * int64_t{s.channels} * 10 + j] = total;
  }
}

// ---- launch helpers -------------------------------------------------------------------------------

bool float_type(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat || t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16;
}

// A thread owns one channel: the channels must divide the block.
bool channels_divide_block(int64_t channels) { return channels >= 1 && channels <= kThreads && kThreads % channels == 0; }

bool fits_int(int64_t n) { return n < (int64_t{1} << 31); }

// Blocks of kThreads that fill every SM of the current GPU.
int64_t max_resident_blocks() {
  return int64_t{at::cuda::getCurrentDeviceProperties()->multiProcessorCount} * (2048 / kThreads);
}

#define AMPLAB_DISPATCH_FLOAT_HALF_BF16(TYPE, NAME, ...) \
  AT_DISPATCH_SWITCH(TYPE, NAME, AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__) AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__) \
                     AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__))

// Sums partial's blocks into grad_weight (weights per channel, may be undefined when 0) and grad_bias.
void sum_partials(const at::Tensor& partial, int weights, at::Tensor& grad_weight, at::Tensor& grad_bias) {
  const int blocks = static_cast<int>(partial.size(0)), columns = static_cast<int>(partial.size(1));
  AMPLAB_DISPATCH_FLOAT_HALF_BF16(grad_bias.scalar_type(), "amplab_sum_partials", [&] {
    sum_partials_kernel<scalar_t><<<columns, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        partial.const_data_ptr<float>(), blocks, columns, weights,
        weights > 0 ? grad_weight.mutable_data_ptr<scalar_t>() : nullptr, grad_bias.mutable_data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

bool bias_fits(const at::Tensor& x, const at::Tensor& bias) {
  return x.is_cuda() && float_type(x) && bias.device() == x.device() && bias.scalar_type() == x.scalar_type() &&
         bias.dim() == 1 && bias.is_contiguous() && x.dim() == 4 && bias.size(0) == x.size(1) && x.numel() > 0 &&
         fits_int(x.numel());
}

// x (N, 1, H, W) with rows of W elements one after another.
bool dense_one_channel(const at::Tensor& x) {
  return x.dim() == 4 && x.size(1) == 1 && x.stride(3) == 1 && x.stride(2) == x.size(3) &&
         (x.size(0) == 1 || x.stride(0) == x.size(2) * x.size(3));
}

ImageShape shape_of(const at::Tensor& x, int64_t channels) {
  return {static_cast<int>(x.size(0)), static_cast<int>(x.size(2)), static_cast<int>(x.size(3)), static_cast<int>(channels)};
}

// The shared-memory tile of one pooled row.
size_t pool_tile_bytes(const at::Tensor& x) { return x.size(1) * (x.size(3) / 2) * x.element_size(); }

}  // namespace

bool bias_relu_max_pool2_supported(const at::Tensor& x, const at::Tensor& bias) {
  return bias_fits(x, bias) && x.is_contiguous(at::MemoryFormat::ChannelsLast) && x.size(2) % 2 == 0 &&
         x.size(3) % 2 == 0 && channels_divide_block(x.size(1)) && pool_tile_bytes(x) <= 32 * 1024;
}

at::Tensor bias_relu_max_pool2_forward(const at::Tensor& x, const at::Tensor& bias) {
  TORCH_CHECK(bias_relu_max_pool2_supported(x, bias), "amplab bias_relu_max_pool2: unsupported input");
  c10::cuda::CUDAGuard guard(x.device());
  const ImageShape s = shape_of(x, x.size(1));
  at::Tensor y = at::empty({s.n, s.channels, s.pooled_h(), s.pooled_w()}, x.options());  // NCHW contiguous
  AMPLAB_DISPATCH_FLOAT_HALF_BF16(x.scalar_type(), "amplab_pool_forward", [&] {
    pool_forward_kernel<scalar_t><<<s.n * s.pooled_h(), kThreads, pool_tile_bytes(x), at::cuda::getCurrentCUDAStream()>>>(
        x.const_data_ptr<scalar_t>(), bias.const_data_ptr<scalar_t>(), y.mutable_data_ptr<scalar_t>(), s);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return y;
}

std::pair<at::Tensor, at::Tensor> bias_relu_max_pool2_backward(const at::Tensor& grad_y_any, const at::Tensor& x,
                                                               const at::Tensor& bias) {
  c10::cuda::CUDAGuard guard(x.device());
  const ImageShape s = shape_of(x, x.size(1));
  TORCH_CHECK(grad_y_any.dim() == 4 && grad_y_any.size(0) == s.n && grad_y_any.size(1) == s.channels &&
                  grad_y_any.size(2) == s.pooled_h() && grad_y_any.size(3) == s.pooled_w() &&
                  grad_y_any.scalar_type() == x.scalar_type(),
              "amplab bias_relu_max_pool2: gradient of the wrong shape or dtype");
  const at::Tensor grad_y = grad_y_any.contiguous();  // NCHW, as y
  const int blocks = s.n * s.pooled_h();
  at::Tensor grad_x = at::empty_like(x);  // every element written: H and W are even
  at::Tensor partial = at::empty({blocks, s.channels}, x.options().dtype(at::kFloat));
  AMPLAB_DISPATCH_FLOAT_HALF_BF16(x.scalar_type(), "amplab_pool_backward", [&] {
    pool_backward_kernel<scalar_t><<<blocks, kThreads, pool_tile_bytes(x), at::cuda::getCurrentCUDAStream()>>>(
        grad_y.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(), bias.const_data_ptr<scalar_t>(),
        grad_x.mutable_data_ptr<scalar_t>(), partial.mutable_data_ptr<float>(), s);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  at::Tensor no_weight, grad_bias = at::empty({s.channels}, bias.options());
  sum_partials(partial, 0, no_weight, grad_bias);
  return {grad_x, grad_bias};
}

bool conv3x3_bias_relu_supported(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const bool input_ok = x.is_cuda() && (x.scalar_type() == at::kFloat || x.scalar_type() == weight.scalar_type()) &&
                        dense_one_channel(x) && x.size(2) >= 3 && x.size(3) >= 3 && fits_int(x.numel());
  const int64_t channels = weight.size(0);
  const bool weight_ok = weight.dim() == 4 && weight.size(1) == 1 && weight.size(2) == 3 && weight.size(3) == 3 &&
                         weight.is_contiguous() && float_type(weight) && weight.device() == x.device();
  const bool bias_ok = bias.dim() == 1 && bias.size(0) == channels && bias.is_contiguous() &&
                       bias.scalar_type() == weight.scalar_type() && bias.device() == x.device();
  // Whole groups of channels per thread, a warp's lanes in whole groups, the block's sums in 40 KB.
  const bool channels_ok = channels % kConvGroup == 0 && 32 % (channels / kConvBackwardGroup) == 0 && channels <= 128;
  return input_ok && weight_ok && bias_ok && channels_ok &&
         fits_int(x.size(0) * (x.size(2) - 2) * (x.size(3) - 2) * channels);
}

namespace {

// Forward: a thread per position and kConvGroup channels, at most a full GPU.
int conv3x3_forward_blocks(const ImageShape& s) {
  const int64_t threads = int64_t{s.out_rows()} * (s.channels / kConvGroup);
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((threads + kThreads - 1) / kThreads, max_resident_blocks())));
}

// Backward: two blocks per SM.
int conv3x3_backward_blocks() { return 2 * at::cuda::getCurrentDeviceProperties()->multiProcessorCount; }

template <class scalar_t, class input_t>
void launch_conv3x3_forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, at::Tensor& y,
                            const ImageShape& s) {
  conv3x3_forward_kernel<scalar_t, input_t><<<conv3x3_forward_blocks(s), kThreads, s.channels * 10 * sizeof(float),
                                              at::cuda::getCurrentCUDAStream()>>>(
      x.const_data_ptr<input_t>(), weight.const_data_ptr<scalar_t>(), bias.const_data_ptr<scalar_t>(),
      y.mutable_data_ptr<scalar_t>(), s);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <class scalar_t, class input_t>
void launch_conv3x3_backward(const at::Tensor& grad_y, const at::Tensor& y, const at::Tensor& x, at::Tensor& partial,
                             const ImageShape& s) {
  conv3x3_backward_kernel<scalar_t, input_t><<<partial.size(0), kThreads, (kThreads / 32) * s.channels * 10 * sizeof(float),
                                               at::cuda::getCurrentCUDAStream()>>>(
      grad_y.const_data_ptr<scalar_t>(), y.const_data_ptr<scalar_t>(), x.const_data_ptr<input_t>(),
      partial.mutable_data_ptr<float>(), s);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

at::Tensor conv3x3_bias_relu_forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  TORCH_CHECK(conv3x3_bias_relu_supported(x, weight, bias), "amplab conv3x3_bias_relu: unsupported input");
  c10::cuda::CUDAGuard guard(x.device());
  const ImageShape s = shape_of(x, weight.size(0));
  at::Tensor y = at::empty({s.n, s.channels, s.h - 2, s.w - 2}, weight.options().memory_format(at::MemoryFormat::ChannelsLast));
  AMPLAB_DISPATCH_FLOAT_HALF_BF16(weight.scalar_type(), "amplab_conv3x3_forward", [&] {
    if (x.scalar_type() == at::kFloat)
      launch_conv3x3_forward<scalar_t, float>(x, weight, bias, y, s);
    else
      launch_conv3x3_forward<scalar_t, scalar_t>(x, weight, bias, y, s);
  });
  return y;
}

std::pair<at::Tensor, at::Tensor> conv3x3_bias_relu_backward(const at::Tensor& grad_y_any, const at::Tensor& y,
                                                             const at::Tensor& x, const at::Tensor& weight) {
  c10::cuda::CUDAGuard guard(x.device());
  const ImageShape s = shape_of(x, weight.size(0));
  const at::Tensor grad_y = grad_y_any.contiguous(at::MemoryFormat::ChannelsLast);
  const int blocks = conv3x3_backward_blocks();
  at::Tensor partial = at::empty({blocks, s.channels * 10}, x.options().dtype(at::kFloat));
  AMPLAB_DISPATCH_FLOAT_HALF_BF16(weight.scalar_type(), "amplab_conv3x3_backward", [&] {
    if (x.scalar_type() == at::kFloat)
      launch_conv3x3_backward<scalar_t, float>(grad_y, y, x, partial, s);
    else
      launch_conv3x3_backward<scalar_t, scalar_t>(grad_y, y, x, partial, s);
  });
  at::Tensor grad_weight = at::empty({s.channels, 1, 3, 3}, weight.options());
  at::Tensor grad_bias = at::empty({s.channels}, weight.options());
  sum_partials(partial, 9, grad_weight, grad_bias);
  return {grad_weight, grad_bias};
}

}  // namespace amplab::cuda
