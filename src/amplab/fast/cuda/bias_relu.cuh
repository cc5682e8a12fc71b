// A bias add and a ReLU, forward and backward, rounded as PyTorch's ops round them; shared by the
// MNIST network's kernels (layer_kernels.cu, mnist_features_kernels.cu).
#pragma once

#include <ATen/NumericUtils.h>

namespace amplab::cuda {

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

}  // namespace amplab::cuda
