// The CUDA kernels lab's MLP (bias_gelu_mlp.hpp).
#include "bias_gelu_mlp.hpp"

#include <torch/torch.h>

#include <cmath>

namespace cuda_kernels {

BiasGeluMlp::BiasGeluMlp(int64_t width, int64_t layers, torch::Device device) {
  auto options = torch::TensorOptions().device(device);
  for (int64_t l = 0; l < layers; ++l) {
    weights.push_back((torch::randn({width, width}, options) / std::sqrt(double(width))).requires_grad_(true));
    biases.push_back((0.1 * torch::randn({width}, options)).requires_grad_(true));
  }
}

torch::Tensor BiasGeluMlp::forward(torch::Tensor h, const Epilogue& epilogue) const {
  for (size_t l = 0; l < weights.size(); ++l)
    h = epilogue ? epilogue(torch::linear(h, weights[l]), biases[l]) : torch::gelu(torch::linear(h, weights[l], biases[l]), "tanh");
  return h;
}

std::vector<torch::Tensor> BiasGeluMlp::parameters() const {
  std::vector<torch::Tensor> params = weights;
  params.insert(params.end(), biases.begin(), biases.end());
  return params;
}

}  // namespace cuda_kernels
