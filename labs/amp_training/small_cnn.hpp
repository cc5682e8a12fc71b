// The AMP lab's small CNN: three 3x3 convolutions, global average pooling and a Linear.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

namespace amp_training {

// (N, 3, S, S) -> (N, classes): convolutions of c, 2c and 4c channels (the last two with stride
// 2), ReLU after each, global average pooling, Linear(4c, classes).
struct SmallCnnImpl : torch::nn::Module {
  SmallCnnImpl(int64_t channels, int64_t classes);
  torch::Tensor forward(torch::Tensor x);
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(SmallCnn);

}  // namespace amp_training
