// Lab 6, CUDA kernels: what the lab binary (apps/cuda_kernels) and the graded tests
// (tests/labs/cuda_kernels_test.cpp) call. Your code is in starter/cuda_kernels/: the kernels and
// their launchers in the .cu files (declared in kernels.hpp, torch-free), the cost model and the
// autograd function in cuda_kernels.cpp. The tensor wrappers below are given: they check the
// tensors, allocate the outputs and call your launchers on torch's current CUDA stream.
#pragma once

#include <torch/types.h>

#include <string>
#include <utility>

#include "amplab/infra/error.hpp"  // AMPLAB_TODO in the starter
#include "kernels.hpp"

namespace cuda_kernels {

// ---- the cost model: what a kernel must at least move and compute (the roofline's x axis) ----------

// FLOPs and bytes of DRAM traffic: each input read once, each output written once, nothing else.
// Real kernels move at least this much; GB/s and FLOP/s in the lab's tables divide these by the
// measured time ("effective" bandwidth and throughput).
struct Cost {
  double flops = 0;  // floating-point operations (a multiply-add is 2)
  double bytes = 0;  // bytes read + written
  double intensity() const { return bytes > 0 ? flops / bytes : 0; }  // FLOP per byte
};

// TODO(cuda_kernels-1)
// Sizes below 0 (and a radius below 0, element_bytes below 1) are amplab::Error naming the argument.
// c = a + b, fp32: n adds; a and b read, c written.
Cost vector_add_cost(int64_t n);
// The sum of n fp32: n - 1 adds (none for n = 0); n floats read, one written.
Cost reduce_cost(int64_t n);
// fp32, (h, w) image, (2r+1) x (2r+1) filter: (2r+1)^2 multiply-adds per output pixel (the border's
// too, whose terms read the zero padding); image and filter read, the (h, w) output written.
Cost conv2d_cost(int64_t h, int64_t w, int64_t radius);
// C = A B with A (m, k), B (k, n): m n k multiply-adds; A and B read, C written, element_bytes each.
Cost matmul_cost(int64_t m, int64_t n, int64_t k, int64_t element_bytes);

// ---- tensor wrappers (given) ----------------------------------------------------------------------
// Inputs must be CUDA tensors, contiguous, of the dtype named; anything else is an amplab::Error
// naming the argument. Outputs are new tensors on the same device.

enum class AddVersion { grid_stride, float4 };
// a + b for 1-D float32 tensors of one size; `threads` per block.
torch::Tensor vector_add(const torch::Tensor& a, const torch::Tensor& b, AddVersion version, int threads = 256);

enum class ReduceVersion { interleaved, sequential, first_add, warp_shuffle };
// The sum of a 1-D float32 tensor, a 0-dim float32 tensor.
torch::Tensor reduce_sum(const torch::Tensor& x, ReduceVersion version, int threads = 256);

enum class ConvVersion { naive, tiled };
// image (h, w) float32, filter (k, k) float32 with k = 3 or 5: the (h, w) output of torch's
// conv2d(image[None, None], filter[None, None], padding=k/2), computed by our kernels.
torch::Tensor conv2d(const torch::Tensor& image, const torch::Tensor& filter, ConvVersion version);

enum class MatmulVersion { naive, tiled, register_blocked, wmma_bf16 };
// a (m, k) @ b (k, n): float32 for the first three, bfloat16 for wmma_bf16 (output bfloat16).
torch::Tensor matmul(const torch::Tensor& a, const torch::Tensor& b, MatmulVersion version);

// Fused bias + GELU (tanh approximation), one kernel each way. x (rows, cols) and bias (cols),
// float32 or bfloat16, one dtype. No autograd: these are what the autograd function calls.
torch::Tensor bias_gelu_forward(const torch::Tensor& x, const torch::Tensor& bias);
// (grad_x, grad_bias) for grad_y of x's shape.
std::pair<torch::Tensor, torch::Tensor> bias_gelu_backward(const torch::Tensor& grad_y, const torch::Tensor& x,
                                                           const torch::Tensor& bias);

// TODO(cuda_kernels-15)
// gelu(x + bias), differentiable: a torch::autograd::Function over the two kernels above. bias is
// cast to x's dtype first (as autocast leaves a bf16 activation with an fp32 bias parameter); its
// gradient flows back through that cast.
torch::Tensor bias_gelu(const torch::Tensor& x, const torch::Tensor& bias);
// The same with PyTorch's own ops, composed: gelu(x + bias.to(x.dtype), approximate="tanh").
torch::Tensor bias_gelu_composed(const torch::Tensor& x, const torch::Tensor& bias);

// Names for tables: "grid-stride", "float4", "interleaved", ..., "wmma bf16".
std::string name(AddVersion version);
std::string name(ReduceVersion version);
std::string name(ConvVersion version);
std::string name(MatmulVersion version);

}  // namespace cuda_kernels
