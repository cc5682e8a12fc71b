#include "amplab/cuda/bias_relu.hpp"

#include <ATen/Dispatch.h>
#include <ATen/NumericUtils.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>

namespace amplab::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 512;  // of the backward passes: enough to fill an H200 several times

// relu(x + b) as PyTorch computes it: the sum rounded to scalar_t, then ReLU (NaN stays NaN).
template <class scalar_t>
__device__ __forceinline__ scalar_t add_relu(scalar_t x, scalar_t b) {
  const scalar_t sum = static_cast<scalar_t>(static_cast<float>(x) + static_cast<float>(b));
  return (at::_isnan(sum) || static_cast<float>(sum) > 0.f) ? sum : static_cast<scalar_t>(0.f);
}

// Whether ReLU let the gradient through: PyTorch's threshold_backward passes it unless y <= 0.
template <class scalar_t>
__device__ __forceinline__ bool passes(scalar_t y) {
  return !(static_cast<float>(y) <= 0.f);
}

// ---- bias + ReLU ----------------------------------------------------------------------------------

template <class scalar_t>
__global__ void bias_relu_forward_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ bias,
                                         scalar_t* __restrict__ y, int64_t n, int channels) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = add_relu(x[i], bias[i % channels]);
}

// Block b sums its rows' gradients per channel into partial[b][c]. Thread t owns channel
// t % channels of every row it visits (blockDim.x is a multiple of channels), so each thread
// keeps one float; the block then adds its rows_per_pass threads of each channel.
template <class scalar_t>
__global__ void bias_relu_backward_kernel(const scalar_t* __restrict__ grad_y, const scalar_t* __restrict__ y,
                                          scalar_t* __restrict__ grad_x, float* __restrict__ partial, int64_t rows,
                                          int channels) {
  __shared__ float sums[kThreads];
  const int c = threadIdx.x % channels;
  const int rows_per_pass = blockDim.x / channels;
  float acc = 0.f;
  for (int64_t r = blockIdx.x * int64_t{rows_per_pass} + threadIdx.x / channels; r < rows;
       r += int64_t{gridDim.x} * rows_per_pass) {
    const int64_t i = r * channels + c;
    const scalar_t g = passes(y[i]) ? grad_y[i] : static_cast<scalar_t>(0.f);
    grad_x[i] = g;
    acc += static_cast<float>(g);
  }
  sums[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x < channels) {
    float total = 0.f;
    for (int k = 0; k < rows_per_pass; ++k) total += sums[k * channels + threadIdx.x];
    partial[blockIdx.x * int64_t{channels} + threadIdx.x] = total;
  }
}

// grad_bias[c] = sum over blocks of partial[b][c], in a fixed order (deterministic): one block
// per channel, a tree over its threads.
template <class scalar_t>
__global__ void sum_partials_kernel(const float* __restrict__ partial, int blocks, int channels,
                                    scalar_t* __restrict__ grad_bias) {
  __shared__ float sums[kThreads];
  const int c = blockIdx.x;
  float acc = 0.f;
  for (int b = threadIdx.x; b < blocks; b += blockDim.x) acc += partial[b * int64_t{channels} + c];
  sums[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) sums[threadIdx.x] += sums[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) grad_bias[c] = static_cast<scalar_t>(sums[0]);
}

// ---- bias + ReLU + 2x2 max-pool (NHWC) ------------------------------------------------------------

struct PoolShape {
  int64_t n, h, w;  // input
  int channels;
  __host__ __device__ int64_t pooled_rows() const { return n * (h / 2) * (w / 2); }
};

// The four inputs of window (n, ph, pw) for channel c after bias and ReLU, and which one the pool
// takes: PyTorch scans rows then columns and moves on when a value is greater or NaN.
template <class scalar_t>
struct Window {
  int64_t at[4];
  scalar_t value[4];
  int arg = 0;

  __device__ Window(const scalar_t* x, scalar_t b, const PoolShape& s, int64_t pooled_row, int c) {
    const int64_t pw = pooled_row % (s.w / 2);
    const int64_t ph = (pooled_row / (s.w / 2)) % (s.h / 2);
    const int64_t n = pooled_row / ((s.w / 2) * (s.h / 2));
    float best = -INFINITY;
    for (int k = 0; k < 4; ++k) {
      at[k] = ((n * s.h + 2 * ph + k / 2) * s.w + 2 * pw + k % 2) * s.channels + c;
      value[k] = add_relu(x[at[k]], b);
      const float v = static_cast<float>(value[k]);
      if (v > best || at::_isnan(v)) {
        best = v;
        arg = k;
      }
    }
  }
};

template <class scalar_t>
__global__ void pool_forward_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ bias,
                                    scalar_t* __restrict__ y, PoolShape s) {
  const int64_t n = s.pooled_rows() * s.channels;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int c = static_cast<int>(i % s.channels);
    Window<scalar_t> window(x, bias[c], s, i / s.channels, c);
    y[i] = window.value[window.arg];
  }
}

// grad_y of shape (N, C, H/2, W/2) with strides gs (elements).
template <class scalar_t>
__global__ void pool_backward_kernel(const scalar_t* __restrict__ grad_y, int64_t gs_n, int64_t gs_c, int64_t gs_h,
                                     int64_t gs_w, const scalar_t* __restrict__ x, const scalar_t* __restrict__ bias,
                                     scalar_t* __restrict__ grad_x, float* __restrict__ partial, PoolShape s) {
  __shared__ float sums[kThreads];
  const int c = threadIdx.x % s.channels;
  const int rows_per_pass = blockDim.x / s.channels;
  const scalar_t b = bias[c];
  float acc = 0.f;
  for (int64_t r = blockIdx.x * int64_t{rows_per_pass} + threadIdx.x / s.channels; r < s.pooled_rows();
       r += int64_t{gridDim.x} * rows_per_pass) {
    Window<scalar_t> window(x, b, s, r, c);
    const int64_t pw = r % (s.w / 2), ph = (r / (s.w / 2)) % (s.h / 2), n = r / ((s.w / 2) * (s.h / 2));
    const scalar_t g = grad_y[n * gs_n + c * gs_c + ph * gs_h + pw * gs_w];
    const scalar_t g_in = passes(window.value[window.arg]) ? g : static_cast<scalar_t>(0.f);
    for (int k = 0; k < 4; ++k) grad_x[window.at[k]] = k == window.arg ? g_in : static_cast<scalar_t>(0.f);
    acc += static_cast<float>(g_in);
  }
  sums[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x < s.channels) {
    float total = 0.f;
    for (int k = 0; k < rows_per_pass; ++k) total += sums[k * s.channels + threadIdx.x];
    partial[blockIdx.x * int64_t{s.channels} + threadIdx.x] = total;
  }
}

// ---- launch helpers -------------------------------------------------------------------------------

bool float_type(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat || t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16;
}

bool channels_innermost(const at::Tensor& x) {
  return (x.dim() == 2 && x.is_contiguous()) || (x.dim() == 4 && x.is_contiguous(at::MemoryFormat::ChannelsLast));
}

bool bias_fits(const at::Tensor& x, const at::Tensor& bias) {
  return x.is_cuda() && float_type(x) && bias.device() == x.device() && bias.scalar_type() == x.scalar_type() &&
         bias.dim() == 1 && bias.is_contiguous() && x.dim() >= 2 && bias.size(0) == x.size(1) && x.numel() > 0;
}

// A thread owns one channel in the backward passes: the channels must divide the block.
bool channels_divide_block(int64_t channels) { return channels >= 1 && channels <= kThreads && kThreads % channels == 0; }

int elementwise_blocks(int64_t n) {
  const int64_t per_sm = 2048 / kThreads;
  const int64_t most = at::cuda::getCurrentDeviceProperties()->multiProcessorCount * per_sm;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, most)));
}

int reduction_blocks(int64_t rows, int channels) {
  const int64_t rows_per_pass = kThreads / channels;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((rows + rows_per_pass - 1) / rows_per_pass, kMaxBlocks)));
}

at::Tensor sum_partials(const at::Tensor& partial, int blocks, int channels, const at::Tensor& like_bias) {
  at::Tensor grad_bias = at::empty({channels}, like_bias.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, like_bias.scalar_type(), "amplab_sum_partials", [&] {
    sum_partials_kernel<scalar_t><<<channels, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        partial.const_data_ptr<float>(), blocks, channels, grad_bias.mutable_data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return grad_bias;
}

}  // namespace

bool bias_relu_supported(const at::Tensor& x, const at::Tensor& bias) {
  return bias_fits(x, bias) && channels_innermost(x) && channels_divide_block(x.size(1));
}

at::Tensor bias_relu_forward(const at::Tensor& x, const at::Tensor& bias) {
  TORCH_CHECK(bias_relu_supported(x, bias), "amplab bias_relu: unsupported input");
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty_like(x);  // keeps x's layout
  const int64_t n = x.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "amplab_bias_relu_forward", [&] {
    bias_relu_forward_kernel<scalar_t><<<elementwise_blocks(n), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.const_data_ptr<scalar_t>(), bias.const_data_ptr<scalar_t>(), y.mutable_data_ptr<scalar_t>(), n,
        static_cast<int>(x.size(1)));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return y;
}

std::pair<at::Tensor, at::Tensor> bias_relu_backward(const at::Tensor& grad_y_any, const at::Tensor& y) {
  c10::cuda::CUDAGuard guard(y.device());
  const auto format = y.dim() == 4 ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  const at::Tensor grad_y = grad_y_any.contiguous(format);
  const int channels = static_cast<int>(y.size(1));
  const int64_t rows = y.numel() / channels;
  const int blocks = reduction_blocks(rows, channels);
  at::Tensor grad_x = at::empty_like(y);
  at::Tensor partial = at::empty({blocks, channels}, y.options().dtype(at::kFloat));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, y.scalar_type(), "amplab_bias_relu_backward", [&] {
    bias_relu_backward_kernel<scalar_t><<<blocks, (kThreads / channels) * channels, 0, at::cuda::getCurrentCUDAStream()>>>(
        grad_y.const_data_ptr<scalar_t>(), y.const_data_ptr<scalar_t>(), grad_x.mutable_data_ptr<scalar_t>(),
        partial.mutable_data_ptr<float>(), rows, channels);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {grad_x, sum_partials(partial, blocks, channels, y)};
}

bool bias_relu_max_pool2_supported(const at::Tensor& x, const at::Tensor& bias) {
  return bias_fits(x, bias) && x.dim() == 4 && x.is_contiguous(at::MemoryFormat::ChannelsLast) &&
         x.size(2) % 2 == 0 && x.size(3) % 2 == 0 && channels_divide_block(x.size(1));
}

at::Tensor bias_relu_max_pool2_forward(const at::Tensor& x, const at::Tensor& bias) {
  TORCH_CHECK(bias_relu_max_pool2_supported(x, bias), "amplab bias_relu_max_pool2: unsupported input");
  c10::cuda::CUDAGuard guard(x.device());
  const PoolShape s{x.size(0), x.size(2), x.size(3), static_cast<int>(x.size(1))};
  at::Tensor y = at::empty({s.n, s.channels, s.h / 2, s.w / 2}, x.options().memory_format(at::MemoryFormat::ChannelsLast));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "amplab_pool_forward", [&] {
    pool_forward_kernel<scalar_t><<<elementwise_blocks(y.numel()), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.const_data_ptr<scalar_t>(), bias.const_data_ptr<scalar_t>(), y.mutable_data_ptr<scalar_t>(), s);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return y;
}

std::pair<at::Tensor, at::Tensor> bias_relu_max_pool2_backward(const at::Tensor& grad_y, const at::Tensor& x,
                                                               const at::Tensor& bias) {
  c10::cuda::CUDAGuard guard(x.device());
  const PoolShape s{x.size(0), x.size(2), x.size(3), static_cast<int>(x.size(1))};
  TORCH_CHECK(grad_y.dim() == 4 && grad_y.size(0) == s.n && grad_y.size(1) == s.channels && grad_y.size(2) == s.h / 2 &&
                  grad_y.size(3) == s.w / 2 && grad_y.scalar_type() == x.scalar_type(),
              "amplab bias_relu_max_pool2: gradient of the wrong shape or dtype");
  const int blocks = reduction_blocks(s.pooled_rows(), s.channels);
  at::Tensor grad_x = at::empty_like(x);  // every element written: H and W are even
  at::Tensor partial = at::empty({blocks, s.channels}, x.options().dtype(at::kFloat));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "amplab_pool_backward", [&] {
    pool_backward_kernel<scalar_t><<<blocks, (kThreads / s.channels) * s.channels, 0, at::cuda::getCurrentCUDAStream()>>>(
        grad_y.const_data_ptr<scalar_t>(), grad_y.stride(0), grad_y.stride(1), grad_y.stride(2), grad_y.stride(3),
        x.const_data_ptr<scalar_t>(), bias.const_data_ptr<scalar_t>(), grad_x.mutable_data_ptr<scalar_t>(),
        partial.mutable_data_ptr<float>(), s);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {grad_x, sum_partials(partial, blocks, s.channels, bias)};
}

}  // namespace amplab::cuda
