// The AMP lab's compute-bound MLP: `layers` x Linear(width, width), ReLU between them.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <vector>

namespace amp_training {

// (N, width) -> (N, width). At width 8192 each Linear is an 8192^3 matmul per 8192 samples.
// Unlike make_mlp (models.hpp), no ReLU after the last Linear.
struct WideMlpImpl : torch::nn::Module {
  WideMlpImpl(int64_t width, int64_t layers);
  torch::Tensor forward(torch::Tensor x);
  std::vector<torch::nn::Linear> linears;  // fc1, fc2, ...
};
TORCH_MODULE(WideMlp);

// FLOPs of one training step, as the GPU does them: per Linear, forward 2*B*in*out and the
// weight gradient 2*B*in*out; the input gradient, 2*B*in*out more, for every layer but the first,
// whose input needs no gradient (autograd never computes it). So (6 * layers - 2) * B * width^2,
// 11/12 of the "6 x batch x parameters" rule for 4 layers; biases and ReLUs neglected.
double wide_mlp_step_flops(int64_t batch, int64_t width, int64_t layers);

}  // namespace amp_training
