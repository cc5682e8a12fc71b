// Layers of the MNIST network whose ends run as one kernel of ours on a GPU
// (src/amplab/fast/cuda/layer_kernels.hpp), and as PyTorch's ops everywhere else:
//   conv3x3_bias_relu(x, w, b)  == relu(conv2d(x, w, b))          x: (N, 1, H, W) images
//   bias_relu_max_pool2(x, b)   == max_pool2d(relu(x + b), 2)      x: a convolution's output, no bias
// Under autocast the weight and bias are cast to its dtype, as autocast casts them for a
// convolution, so their gradients reach the float32 parameters through those casts. Same
// values as the PyTorch ops up to the order of float sums (layer_kernels.hpp says which).
#pragma once

#include <torch/types.h>

namespace amplab {

torch::Tensor conv3x3_bias_relu(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);
torch::Tensor bias_relu_max_pool2(const torch::Tensor& x, const torch::Tensor& bias);

// Whether these calls run our kernels (a GPU, and shapes, layouts and dtypes they take) or PyTorch's ops.
bool conv3x3_bias_relu_runs_fused(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);
bool bias_relu_max_pool2_runs_fused(const torch::Tensor& x, const torch::Tensor& bias);

}  // namespace amplab
