// The AMP lab's compute-bound MLP: `layers` x Linear(width, width), ReLU between them.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <vector>

namespace amplab {

// (N, width) -> (N, width). At width 8192 each Linear is an 8192^3 matmul per 8192 samples.
// Unlike make_mlp (models.hpp), no ReLU after the last Linear.
struct WideMlpImpl : torch::nn::Module {
  WideMlpImpl(int64_t width, int64_t layers);
  torch::Tensor forward(torch::Tensor x);
  std::vector<torch::nn::Linear> linears;  // fc1, fc2, ...
};
TORCH_MODULE(WideMlp);

// FLOPs of one training step: forward 2*B*in*out per Linear, backward twice that (input and
// weight gradients): 6*B*in*out, biases neglected. The first layer's input gradient is never
// computed (the input needs none), so the hardware does 11/12 of this for 4 layers; the count is
// the usual "6 x batch x parameters" convention of the reference numbers.
double wide_mlp_step_flops(int64_t batch, int64_t width, int64_t layers);

}  // namespace amplab
