// CUDA kernels for the MNIST network's two convolution layers, each layer's end in one kernel:
//   conv3x3_bias_relu:   y = relu(conv2d(x, weight) + bias)   for a one-channel image x
//   bias_relu_max_pool2: y = max_pool2d(relu(x + bias), 2)    for a convolution's output x
// forward in one kernel, backward in one pass plus a small sum over its blocks, where PyTorch runs
// a convolution, a bias add, a ReLU, a pool, their backward kernels and separate reductions for the
// bias (and, for the one-channel convolution, cuDNN kernels that leave most of the GPU idle).
//
// Values follow PyTorch's ops: sums rounded to the dtype before the bias, the bias sum rounded
// before the ReLU, the pool keeps the first maximum of each window (a NaN wins, as in PyTorch).
// The pool's output and input gradient are PyTorch's to the bit; the convolution's nine products
// are summed in float in a fixed order (cuDNN's order is its own), and the weight and bias
// gradients are float sums in another order than PyTorch's.
//
// Layouts: the convolution's x is (N, 1, H, W) dense, float or the weight's dtype (then rounded to
// it, as autocast's cast would); its weight (C, 1, 3, 3) and bias (C) contiguous; y channels-last.
// The pool's x is (N, C, H, W) channels-last with H and W even, C dividing 256; the convolution's
// C is a multiple of 8, at most 128. *_supported says whether a call can take its tensors
// (fused_layers.hpp falls back to PyTorch's ops otherwise).
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

namespace amplab::cuda {

bool conv3x3_bias_relu_supported(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);
// (N, 1, H, W) -> (N, C, H-2, W-2), channels-last; stride 1, no padding.
at::Tensor conv3x3_bias_relu_forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);
// Gradients of the weight and the bias (x's is not computed: the images need none).
std::pair<at::Tensor, at::Tensor> conv3x3_bias_relu_backward(const at::Tensor& grad_y, const at::Tensor& y,
                                                             const at::Tensor& x, const at::Tensor& weight);

bool bias_relu_max_pool2_supported(const at::Tensor& x, const at::Tensor& bias);
// (N, C, H, W) -> (N, C, H/2, W/2), contiguous (NCHW): the flatten that follows in the MNIST net
// is then a view, not a copy.
at::Tensor bias_relu_max_pool2_forward(const at::Tensor& x, const at::Tensor& bias);
// grad_y of any strides; x and bias as given to the forward. Gradients of x and of the bias.
std::pair<at::Tensor, at::Tensor> bias_relu_max_pool2_backward(const at::Tensor& grad_y, const at::Tensor& x,
                                                               const at::Tensor& bias);

}  // namespace amplab::cuda
