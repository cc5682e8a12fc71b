#include "small_cnn.hpp"

#include <torch/torch.h>

namespace amp_training {

SmallCnnImpl::SmallCnnImpl(int64_t c, int64_t classes) {
  using torch::nn::Conv2dOptions;
  conv1 = register_module("conv1", torch::nn::Conv2d(Conv2dOptions(3, c, /*kernel_size=*/3).padding(1)));
  conv2 = register_module("conv2", torch::nn::Conv2d(Conv2dOptions(c, 2 * c, 3).stride(2).padding(1)));
  conv3 = register_module("conv3", torch::nn::Conv2d(Conv2dOptions(2 * c, 4 * c, 3).stride(2).padding(1)));
  fc = register_module("fc", torch::nn::Linear(4 * c, classes));
}

torch::Tensor SmallCnnImpl::forward(torch::Tensor x) {
  x = torch::relu(conv1(x));
  x = torch::relu(conv2(x));
  x = torch::relu(conv3(x));
  x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);  // (N, 4c)
  return fc(x);
}

}  // namespace amp_training
