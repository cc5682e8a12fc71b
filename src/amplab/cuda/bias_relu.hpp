// CUDA kernels for the ends of a convolution or linear layer without its bias:
//   bias_relu:           y = relu(x + bias)
//   bias_relu_max_pool2: y = max_pool2d(relu(x + bias), 2)
// one kernel forward and one pass (plus a small per-channel sum) backward, where PyTorch runs
// an add, a ReLU, a pool and their backward kernels, and a separate bias-gradient reduction.
// Values follow PyTorch's ops to the bit: the sum is rounded to x's dtype before the ReLU, the pool
// keeps the first maximum of each window (a NaN wins, as in PyTorch), and the gradient of x is
// PyTorch's; the bias gradient is the same sum in float, in another order.
//
// x has its channels innermost: 2-d (rows, C) contiguous, or 4-d (N, C, H, W) channels-last;
// the bias is 1-d of x's dtype. *_supported says whether a call can take x (see fused_layers.hpp,
// which falls back to PyTorch's ops otherwise).
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

namespace amplab::cuda {

bool bias_relu_supported(const at::Tensor& x, const at::Tensor& bias);
at::Tensor bias_relu_forward(const at::Tensor& x, const at::Tensor& bias);
// grad_y in y's layout. Returns the gradients of x and of the bias.
std::pair<at::Tensor, at::Tensor> bias_relu_backward(const at::Tensor& grad_y, const at::Tensor& y);

bool bias_relu_max_pool2_supported(const at::Tensor& x, const at::Tensor& bias);
// (N, C, H, W) -> (N, C, H/2, W/2), channels-last.
at::Tensor bias_relu_max_pool2_forward(const at::Tensor& x, const at::Tensor& bias);
// grad_y of any strides; x and bias as given to the forward.
std::pair<at::Tensor, at::Tensor> bias_relu_max_pool2_backward(const at::Tensor& grad_y, const at::Tensor& x,
                                                               const at::Tensor& bias);

}  // namespace amplab::cuda
