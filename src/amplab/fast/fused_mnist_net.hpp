// The MNIST network of models.hpp with its convolutions in kernels of ours (fused_layers.hpp): under
// bf16 or fp16 autocast both convolutions and the pool in one kernel (one backward), else conv1 +
// bias + ReLU in one and conv2's bias + ReLU + 2x2 max-pool in another. The same parameters under
// the same names (checkpoints and safetensors files go from one to the other), the same values and
// gradients up to the order of float sums, in fewer and faster kernels.
#pragma once

#include "amplab/models/models.hpp"

namespace amplab {

struct FusedMnistNetImpl : MnistNetImpl {
  // On a GPU our kernels; elsewhere MnistNetImpl::forward, since our kernels are CUDA only.
  torch::Tensor forward(torch::Tensor x) override;
  // Under bf16 or fp16 autocast on a GPU, fused_layers' linear: the same values, the parameters'
  // gradients written in float32 by cuBLAS (no casts, no slow column sum for the bias).
  torch::Tensor linear(torch::nn::Linear& layer, const torch::Tensor& x) override;
};

// A MnistNet computed by FusedMnistNetImpl: it goes wherever a MnistNet goes.
MnistNet make_fused_mnist_net();

}  // namespace amplab
