// The ends of a layer as one kernel of ours on a GPU (src/amplab/cuda/bias_relu.hpp), with
// PyTorch's ops everywhere else:
//   bias_relu(x, b)           == relu(x + b)                     (b along dimension 1)
//   bias_relu_max_pool2(x, b) == max_pool2d(relu(x + b), 2)
// x is a convolution's or linear layer's output computed without its bias. The bias is first cast
// to x's dtype, as autocast casts it for the layer, so its gradient arrives in the parameter's
// dtype through that cast. Same values as the PyTorch ops, and the same gradients (the bias's is
// summed in another order).
#pragma once

#include <torch/types.h>

namespace amplab {

torch::Tensor bias_relu(const torch::Tensor& x, const torch::Tensor& bias);
torch::Tensor bias_relu_max_pool2(const torch::Tensor& x, const torch::Tensor& bias);

// Whether these calls run our kernels (a GPU, and a layout and dtype they take) or PyTorch's ops.
bool bias_relu_runs_fused(const torch::Tensor& x, const torch::Tensor& bias);
bool bias_relu_max_pool2_runs_fused(const torch::Tensor& x, const torch::Tensor& bias);

}  // namespace amplab
