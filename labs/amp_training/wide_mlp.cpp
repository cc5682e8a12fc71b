#include "wide_mlp.hpp"

#include <torch/torch.h>

namespace amp_training {

WideMlpImpl::WideMlpImpl(int64_t width, int64_t layers) {
  for (int64_t i = 0; i < layers; ++i)
    linears.push_back(register_module("fc" + std::to_string(i + 1), torch::nn::Linear(width, width)));
}

torch::Tensor WideMlpImpl::forward(torch::Tensor x) {
  for (size_t i = 0; i < linears.size(); ++i) {
    x = linears[i]->forward(x);
    if (i + 1 < linears.size()) x = torch::relu(x);
  }
  return x;
}

double wide_mlp_step_flops(int64_t batch, int64_t width, int64_t layers) {
  if (layers <= 0) return 0.0;
  return (6.0 * static_cast<double>(layers) - 2.0) * static_cast<double>(batch) * static_cast<double>(width) *
         static_cast<double>(width);
}

}  // namespace amp_training
