// A deep, narrow net whose gradients are small: the case loss scaling exists for (AMP lab).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <vector>

namespace amp_training {

// (N, width) -> (N, 10): `depth` x (Linear(width, width) + tanh), then Linear(width, 10).
struct DeepNarrowImpl : torch::nn::Module {
  DeepNarrowImpl(int64_t depth, int64_t width);
  torch::Tensor forward(torch::Tensor x);
  std::vector<torch::nn::Linear> layers;  // fc1, fc2, ...
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(DeepNarrow);

}  // namespace amp_training
