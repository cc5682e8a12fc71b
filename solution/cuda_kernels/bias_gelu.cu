// Lab 6, part 5: a fused training op, y = gelu(x + bias) (tanh approximation), forward and
// backward one kernel each, in fp32 or bf16 storage with fp32 math. See labs/cuda_kernels/README.md,
// part 5 (kernel fusion, arithmetic intensity). The torch::autograd::Function around them is in
// cuda_kernels.cpp.
#include <algorithm>

#include "cuda_check.cuh"
#include "kernels.hpp"

namespace cuda_kernels {

namespace {

[[maybe_unused]] void check_bias_gelu_arguments(const char* function, int64_t rows, int64_t cols, DType dtype) {
  check_size(function, "rows", rows);
  check_size(function, "cols", cols);
  if (dtype != DType::f32 && dtype != DType::bf16)
    bad_argument(function, "dtype", static_cast<int64_t>(dtype), "f32 or bf16");
}

}  // namespace

// z = x + b as the composed ops compute it: the sum in fp32, rounded to the storage type.
template <class T>
__device__ __forceinline__ float biased(T x, T b) {
  return to_float(from_float<T>(to_float(x) + to_float(b)));
}

// V: elements per 16-byte access (4 floats, 8 bf16), or 1 (one element at a time).
template <class T, int V>
__global__ void bias_gelu_forward_kernel(const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ y,
                                         int64_t rows, int64_t cols) {
  // TODO(cuda_kernels-13): One pass over x: load, add the bias of the element's column, GELU
  // (gelu_tanh, in fp32), round to T once, store. Composed, PyTorch writes x + bias to memory and
  // reads it back for the GELU: the fused kernel moves about half the bytes. A grid-stride loop
  // over V-element vectors (16-byte loads and stores; V > 1 only when the launcher saw that cols is
  // a multiple of V and the pointers are aligned, so that a vector never straddles two rows), or
  // over single elements for V == 1. The bias holds one value per column; x is row-major.
  // BEGIN SOLUTION DEVICE
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t total = rows * cols;
  if constexpr (V == 1) {
    for (int64_t i = first; i < total; i += stride)
      y[i] = from_float<T>(gelu_tanh(biased(x[i], bias[i % cols])));
  } else {
    for (int64_t v = first; v < total / V; v += stride) {
      const int64_t i = v * V, col = i % cols;
      alignas(16) T xv[V], bv[V], yv[V];
      *reinterpret_cast<uint4*>(xv) = *reinterpret_cast<const uint4*>(x + i);
      *reinterpret_cast<uint4*>(bv) = *reinterpret_cast<const uint4*>(bias + col);
#pragma unroll
      for (int e = 0; e < V; ++e) yv[e] = from_float<T>(gelu_tanh(biased(xv[e], bv[e])));
      *reinterpret_cast<uint4*>(y + i) = *reinterpret_cast<const uint4*>(yv);
    }
  }
  // END SOLUTION
}

template <class T>
void launch_bias_gelu_forward(const void* x, const void* bias, void* y, int64_t rows, int64_t cols, int threads,
                              cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  const T* xt = static_cast<const T*>(x);
  const T* bt = static_cast<const T*>(bias);
  T* yt = static_cast<T*>(y);
  const bool vectors = cols % V == 0 && aligned16(x) && aligned16(bias) && aligned16(y);
  const int64_t items = vectors ? rows * cols / V : rows * cols;
  const int sms = sm_count();
  if (vectors) {
    const int64_t blocks = std::min(ceil_div(items, threads), int64_t{sms} * blocks_per_sm(bias_gelu_forward_kernel<T, V>, threads));
    bias_gelu_forward_kernel<T, V><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(xt, bt, yt, rows, cols);
  } else {
    const int64_t blocks = std::min(ceil_div(items, threads), int64_t{sms} * blocks_per_sm(bias_gelu_forward_kernel<T, 1>, threads));
    bias_gelu_forward_kernel<T, 1><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(xt, bt, yt, rows, cols);
  }
  check_launch("bias_gelu_forward_kernel");
}

void bias_gelu_forward(const void* x, const void* bias, void* y, int64_t rows, int64_t cols, DType dtype,
                       cudaStream_t stream) {
  // TODO(cuda_kernels-13): Check rows, cols and dtype, nothing to do for an empty x, then launch
  // the kernel for the dtype (float or __nv_bfloat16) through launch_bias_gelu_forward (given: it
  // picks the vector width and a one-wave grid-stride grid of 256-thread blocks).
  // BEGIN SOLUTION
  check_bias_gelu_arguments("bias_gelu_forward", rows, cols, dtype);
  if (rows == 0 || cols == 0) return;
  if (dtype == DType::f32)
    launch_bias_gelu_forward<float>(x, bias, y, rows, cols, 256, stream);
  else
    launch_bias_gelu_forward<__nv_bfloat16>(x, bias, y, rows, cols, 256, stream);
  // END SOLUTION
}

// The backward kernel's blocks: kStripCols columns (a warp's width) x kStripWarps warps, each warp
// walking down the rows of the block's columns.
constexpr int kStripCols = 32, kStripWarps = 32;

// Two blocks of 1024 threads per SM (the most an SM holds: 2048 threads) need <= 32 registers.
template <class T>
__global__ void __launch_bounds__(kStripCols * kStripWarps, 2)
    bias_gelu_backward_kernel(const T* __restrict__ grad_y, const T* __restrict__ x, const T* __restrict__ bias,
                              T* __restrict__ grad_x, T* __restrict__ grad_bias, int64_t rows, int64_t cols) {
  // TODO(cuda_kernels-14): Two results in one pass over grad_y and x: grad_x element-wise
  // (grad_y * gelu_tanh_grad(z), rounded to T), and grad_bias, the sum of grad_x down each column.
  // The column sums decide the shape: block b owns the kStripCols columns from b * kStripCols and
  // all the rows, so it can finish its columns' sums itself, in a fixed order (the same bits every
  // run) and with no second kernel. Map the block's threads so that a warp reads consecutive
  // elements of a row (coalesced) and each thread keeps its part of one column's sum in a register
  // (sum the rounded grad_x values, in fp32), with several rows' loads in flight per thread. Then
  // the parts of each column meet in shared memory and are added up in a fixed order into
  // grad_bias (rounded to T). Threads past the last column do no loads but must still reach the
  // __syncthreads. rows == 0 still writes grad_bias = 0.
  // BEGIN SOLUTION DEVICE
  __shared__ float sums[kStripWarps][kStripCols];
  const int lane = threadIdx.x, warp = threadIdx.y;
  const int64_t col = int64_t{blockIdx.x} * kStripCols + lane;
  float sum = 0.f;
  if (col < cols) {
    const T b = bias[col];
    auto step = [&](int64_t row) {
      const int64_t i = row * cols + col;
      const T g = from_float<T>(to_float(grad_y[i]) * gelu_tanh_grad(biased(x[i], b)));
      grad_x[i] = g;
      sum += to_float(g);
    };
    int64_t row = warp;
    for (; row + 3 * kStripWarps < rows; row += 4 * kStripWarps) {
      // Four rows' loads first, then the math: four loads of each input in flight per thread.
      T gy[4], xv[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        gy[u] = grad_y[(row + u * kStripWarps) * cols + col];
        xv[u] = x[(row + u * kStripWarps) * cols + col];
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const T g = from_float<T>(to_float(gy[u]) * gelu_tanh_grad(biased(xv[u], b)));
        grad_x[(row + u * kStripWarps) * cols + col] = g;
        sum += to_float(g);
      }
    }
    for (; row < rows; row += kStripWarps) step(row);
  }
  sums[warp][lane] = sum;
  __syncthreads();
  if (warp == 0 && col < cols) {
    float total = 0.f;
    for (int w = 0; w < kStripWarps; ++w) total += sums[w][lane];  // fixed order: deterministic
    grad_bias[col] = from_float<T>(total);
  }
  // END SOLUTION
}

void bias_gelu_backward(const void* grad_y, const void* x, const void* bias, void* grad_x, void* grad_bias,
                        int64_t rows, int64_t cols, DType dtype, cudaStream_t stream) {
  // TODO(cuda_kernels-14): Check the arguments; nothing to do without columns (but rows == 0 with
  // columns must still zero grad_bias); one block of kStripCols x kStripWarps threads per strip of
  // kStripCols columns, for the dtype.
  // BEGIN SOLUTION
  check_bias_gelu_arguments("bias_gelu_backward", rows, cols, dtype);
  if (cols == 0) return;
  const dim3 block(kStripCols, kStripWarps);
  const unsigned blocks = static_cast<unsigned>(ceil_div(cols, kStripCols));
  if (dtype == DType::f32) {
    bias_gelu_backward_kernel<float><<<blocks, block, 0, stream>>>(
        static_cast<const float*>(grad_y), static_cast<const float*>(x), static_cast<const float*>(bias),
        static_cast<float*>(grad_x), static_cast<float*>(grad_bias), rows, cols);
  } else {
    using bf16 = __nv_bfloat16;
    bias_gelu_backward_kernel<bf16><<<blocks, block, 0, stream>>>(
        static_cast<const bf16*>(grad_y), static_cast<const bf16*>(x), static_cast<const bf16*>(bias),
        static_cast<bf16*>(grad_x), static_cast<bf16*>(grad_bias), rows, cols);
  }
  check_launch("bias_gelu_backward_kernel");
  // END SOLUTION
}

}  // namespace cuda_kernels
