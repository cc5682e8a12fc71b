// Lab 6, CUDA kernels: the launchers of the kernels you write (starter/cuda_kernels/*.cu).
// Torch-free on purpose: raw device pointers, sizes and a CUDA stream, so that the .cu files
// compile with nvcc alone, in seconds. The torch-facing wrappers (tensors in, tensors out, the
// current stream) are in cuda_kernels.hpp; the lab binary and the graded tests call those.
//
// Every launcher checks its arguments before touching the GPU: a bad size or block size is an
// amplab::Error naming the function and the argument ("vector_add_float4: n = -1: ..."); an empty
// input launches nothing (a grid of 0 blocks is a launch error). Launch errors are thrown as
// amplab::Error too (check_launch in cuda_check.cuh). All sizes are elements, not bytes.
#pragma once

#include <cstdint>

// As <driver_types.h> declares it, so that this header needs no CUDA header.
typedef struct CUstream_st* cudaStream_t;

namespace cuda_kernels {

// ---- Part 1: element-wise, c = a + b ------------------------------------------------------------

// TODO(cuda_kernels-2)
// Blocks for a grid-stride kernel over `n` items with `threads` threads per block: one item per
// thread, but at most `sms * blocks_per_sm` blocks (one wave of resident blocks; more would only
// wait for a free SM). 0 for n == 0. n < 0, threads not a multiple of 32 in [32, 1024], or
// sms / blocks_per_sm < 1 are errors naming the argument.
int64_t grid_stride_blocks(int64_t n, int threads, int sms, int blocks_per_sm);
// c[i] = a[i] + b[i] for i < n (fp32), a grid-stride loop, one float per load.
void vector_add_grid_stride(const float* a, const float* b, float* c, int64_t n, int threads, cudaStream_t stream);

// TODO(cuda_kernels-3)
// The same with 16-byte loads and stores (float4) where the pointers allow it.
void vector_add_float4(const float* a, const float* b, float* c, int64_t n, int threads, cudaStream_t stream);

// ---- Part 2: reduction, *out = sum of x[0..n) ---------------------------------------------------

// Floats of device scratch memory a reduction of `n` inputs needs (the partial sums of its passes,
// for any block size >= 32). Given.
int64_t reduce_workspace_floats(int64_t n);

// Each writes the fp32 sum of x[0..n) to out[0] (a device pointer), 0 for n == 0, using
// `workspace` (reduce_workspace_floats(n) floats) for partial sums. `threads` (per block) must be
// a power of two in [32, 1024]: the tree halves it at each step.
// TODO(cuda_kernels-4): shared-memory tree, interleaved addressing.
void reduce_interleaved(const float* x, int64_t n, float* out, float* workspace, int threads, cudaStream_t stream);
// TODO(cuda_kernels-5): shared-memory tree, sequential addressing.
void reduce_sequential(const float* x, int64_t n, float* out, float* workspace, int threads, cudaStream_t stream);
// TODO(cuda_kernels-6): the first add during the load (two inputs per thread).
void reduce_first_add(const float* x, int64_t n, float* out, float* workspace, int threads, cudaStream_t stream);
// TODO(cuda_kernels-7): grid-stride float4 loads, warp shuffles, two passes (or one with atomics).
void reduce_warp_shuffle(const float* x, int64_t n, float* out, float* workspace, int threads, cudaStream_t stream);

// ---- Part 3: 2D convolution of a one-channel image -----------------------------------------------

// out = image correlated with a (2r+1) x (2r+1) filter, zero padding, same size as the image (what
// torch's conv2d computes with padding r): for 0 <= y < h, 0 <= x < w,
//   out[y][x] = sum over |dy|, |dx| <= r of filter[dy + r][dx + r] * image[y + dy][x + dx]
// with image values outside the image read as 0. image, out: (h, w); filter: (2r+1, 2r+1); fp32,
// row-major, on the device.
// Given: the naive version, every thread reading its (2r+1)^2 inputs from global memory.
void conv2d_naive(const float* image, int64_t h, int64_t w, const float* filter, int radius, float* out,
                  cudaStream_t stream);
// TODO(cuda_kernels-8): a shared-memory tile with its halo; radius 1 (3x3) or 2 (5x5).
void conv2d_tiled(const float* image, int64_t h, int64_t w, const float* filter, int radius, float* out,
                  cudaStream_t stream);

// ---- Part 4: matrix multiply, C = A B ----------------------------------------------------------

// A (m, k), B (k, n), C (m, n), row-major and dense, on the device. k == 0 gives C = 0.
// TODO(cuda_kernels-9): one thread per element of C.
void matmul_naive(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k, cudaStream_t stream);
// TODO(cuda_kernels-10): shared-memory tiles.
void matmul_tiled(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k, cudaStream_t stream);
// TODO(cuda_kernels-11): register blocking (each thread computes a small tile of C).
void matmul_register_blocked(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k,
                             cudaStream_t stream);
// TODO(cuda_kernels-12) (stretch): tensor cores through WMMA. A, B and C are bf16 (2 bytes each:
// torch's kBFloat16, CUDA's __nv_bfloat16); products are summed in fp32, C rounded once at the end.
void matmul_wmma_bf16(const void* a, const void* b, void* c, int64_t m, int64_t n, int64_t k, cudaStream_t stream);

// ---- Part 5: fused bias + GELU ------------------------------------------------------------------

// The element types of the fused op (math is fp32 in both).
enum class DType { f32, bf16 };

// GELU, tanh approximation (PyTorch's gelu(approximate="tanh")):
//   gelu(z) = 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3)))
// x, y: (rows, cols) row-major; bias: (cols). All of one dtype, on the device.
// TODO(cuda_kernels-13): y = gelu(x + bias) in one kernel (x + bias rounded to the dtype first,
// as the composed ops round it).
void bias_gelu_forward(const void* x, const void* bias, void* y, int64_t rows, int64_t cols, DType dtype,
                       cudaStream_t stream);
// TODO(cuda_kernels-14): in one kernel, with z = x + bias (rounded as in the forward),
//   grad_x[i][j] = grad_y[i][j] * gelu'(z[i][j])      (rounded to the dtype)
//   grad_bias[j] = sum over i of grad_x[i][j]          (the rounded values, summed in fp32)
void bias_gelu_backward(const void* grad_y, const void* x, const void* bias, void* grad_x, void* grad_bias,
                        int64_t rows, int64_t cols, DType dtype, cudaStream_t stream);

}  // namespace cuda_kernels
