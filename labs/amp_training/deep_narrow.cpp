#include "deep_narrow.hpp"

#include <torch/torch.h>

namespace amp_training {

DeepNarrowImpl::DeepNarrowImpl(int64_t depth, int64_t width) {
  for (int64_t i = 0; i < depth; ++i)
    layers.push_back(register_module("fc" + std::to_string(i + 1), torch::nn::Linear(width, width)));
  head = register_module("head", torch::nn::Linear(width, 10));
}

torch::Tensor DeepNarrowImpl::forward(torch::Tensor x) {
  for (auto& layer : layers) x = torch::tanh(layer->forward(x));
  return head->forward(x);
}

}  // namespace amp_training
