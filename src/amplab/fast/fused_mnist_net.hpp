// The MNIST network of models.hpp in kernels of ours (fused_layers.hpp). Under bf16 or fp16
// autocast: both convolutions, the pool and the first dropout in one kernel (one backward); fc1 with
// its parameters' gradients in float32; fc1's ReLU, the second dropout, fc2 and log-softmax in one
// kernel (one backward).
// In fp32: conv1 + bias + ReLU in one kernel, conv2's bias + ReLU + 2x2 max-pool in another, the
// rest PyTorch's ops. The same parameters under the same names (checkpoints and safetensors files go
// from one to the other), the same values and gradients up to the order of float sums, in fewer and
// faster kernels; the one difference: under autocast our kernels draw the dropouts' masks
// (PyTorch's distribution, other masks).
#pragma once

#include "amplab/models/models.hpp"

namespace amplab {

struct FusedMnistNetImpl : MnistNetImpl {
  // On a GPU our kernels; elsewhere MnistNetImpl::forward, since our kernels are CUDA only.
  torch::Tensor forward(torch::Tensor x) override;
};

// A MnistNet computed by FusedMnistNetImpl: it goes wherever a MnistNet goes.
MnistNet make_fused_mnist_net();

}  // namespace amplab
