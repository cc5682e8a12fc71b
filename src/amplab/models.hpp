// Models several labs share.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>

namespace amplab {

// The network of pytorch/examples' mnist/main.py. Input (N, 1, 28, 28), output (N, 10)
// log-probabilities.
struct MnistNetImpl : torch::nn::Module {
  MnistNetImpl();
  // On a GPU with fused_kernels, forward_fused; otherwise the textbook layers of main.py.
  torch::Tensor forward(torch::Tensor x);
  // The same network with conv1 + bias + ReLU and conv2's bias + ReLU + pool each one kernel of
  // ours (fused_layers.hpp): the same values and gradients, in fewer and faster kernels.
  torch::Tensor forward_fused(torch::Tensor x);
  // Both forwards' end, from the pooled features: dropout, fc1 + ReLU, dropout, fc2, log-softmax.
  torch::Tensor classify(torch::Tensor x);
  bool fused_kernels = true;
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};         // 1 -> 32 -> 64 channels, 3x3
  torch::nn::Dropout dropout1{nullptr}, dropout2{nullptr};  // p = 0.25 after pooling, 0.5 after fc1
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};             // 9216 -> 128 -> 10
};
TORCH_MODULE(MnistNet);

// `layers` x (Linear(width, width) + ReLU): the compute-bound model of DESIGN.md's benchmarks
// (4 x Linear(8192, 8192)).
torch::nn::Sequential make_mlp(int64_t width, int64_t layers);

// Python's model.to(memory_format=torch.channels_last): 4-d parameters (convolution weights) in
// NHWC order, so that cuDNN need not transpose them on every call.
void to_channels_last(torch::nn::Module& model);

}  // namespace amplab
