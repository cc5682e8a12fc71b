// The CUDA kernels lab's MLP: `layers` x (Linear(width, width) without bias, then bias + GELU by a given epilogue).
#pragma once

#include <torch/types.h>

#include <functional>
#include <vector>

namespace cuda_kernels {

// (N, width) -> (N, width). Plain tensors, not a module: the lab times ways of applying each
// layer's bias and GELU, given as the epilogue.
struct BiasGeluMlp {
  // gelu(z + bias) however the caller computes it; z = h W^T.
  using Epilogue = std::function<torch::Tensor(const torch::Tensor& z, const torch::Tensor& bias)>;

  // Weights N(0, 1 / width), biases N(0, 0.01), each layer's weight drawn before its bias.
  BiasGeluMlp(int64_t width, int64_t layers, torch::Device device);
  // Each layer epilogue(linear(h, W), b); without an epilogue gelu(linear(h, W, b), "tanh"), the
  // bias added in cuBLAS's epilogue.
  torch::Tensor forward(torch::Tensor h, const Epilogue& epilogue) const;
  std::vector<torch::Tensor> parameters() const;  // the weights, then the biases

  std::vector<torch::Tensor> weights, biases;
};

}  // namespace cuda_kernels
