// Layers of the MNIST network that run as kernels of ours on a GPU (src/amplab/fast/cuda/), and as
// PyTorch's ops everywhere else:
//   mnist_features(x, w1, b1, w2, b2, p)
//       == dropout(max_pool2d(relu(conv2d(relu(conv2d(x, w1, b1)), w2, b2)), 2), p), dropout with
//       probability p (0: none), both convolutions, the pool and the dropout in one kernel (and one
//       backward) under bf16 or fp16 autocast (mnist_features_kernels.hpp; the mask drawn in the
//       kernel: PyTorch's distribution, not its mask); otherwise the two calls below, then PyTorch's ops
//   linear(x, w, b)             == torch::linear(x, w, b) under bf16 or fp16 autocast, whose
//       float32 weight and bias get their gradients in float32 straight from cuBLAS (the weight's
//       as a matrix product with a float32 output, the bias's as ones^T g), without the casts and
//       the slow column sum autograd would run; elsewhere torch::linear itself
//   mnist_head(h, w2, b2, p)    == log_softmax(linear(dropout(relu(h), p), w2, b2), 1), dropout with
//       probability p (0: none), under bf16 or fp16 autocast in one kernel and one backward
//       (mnist_head_kernels.hpp), the mask drawn in the kernel: PyTorch's distribution, not its mask;
//       elsewhere those ops, linear() above for fc2
//   conv3x3_bias_relu(x, w, b)  == relu(conv2d(x, w, b))          x: (N, 1, H, W) images
//   bias_relu_max_pool2(x, b)   == max_pool2d(relu(x + b), 2)      x: a convolution's output, no bias
// Under autocast the weight and bias are cast to its dtype, as autocast casts them for a
// convolution, so their gradients reach the float32 parameters through those casts. Same
// values as the PyTorch ops up to the order of float sums (layer_kernels.hpp says which).
#pragma once

#include <torch/types.h>

namespace amplab {

torch::Tensor mnist_features(const torch::Tensor& x, const torch::Tensor& w1, const torch::Tensor& b1,
                             const torch::Tensor& w2, const torch::Tensor& b2, double p = 0);
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);
torch::Tensor mnist_head(const torch::Tensor& h, const torch::Tensor& w2, const torch::Tensor& b2, double p);
torch::Tensor conv3x3_bias_relu(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);
torch::Tensor bias_relu_max_pool2(const torch::Tensor& x, const torch::Tensor& bias);

// Whether these calls run our kernels (mnist_features: its one kernel) (a GPU, and shapes, layouts and dtypes they take) or PyTorch's ops.
bool linear_runs_fused(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);
bool mnist_features_runs_fused(const torch::Tensor& x, const torch::Tensor& w1, const torch::Tensor& b1,
                                const torch::Tensor& w2, const torch::Tensor& b2);
bool mnist_head_runs_fused(const torch::Tensor& h, const torch::Tensor& w2, const torch::Tensor& b2);
bool conv3x3_bias_relu_runs_fused(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);
bool bias_relu_max_pool2_runs_fused(const torch::Tensor& x, const torch::Tensor& bias);

}  // namespace amplab
