#include "amplab/models.hpp"

#include <torch/torch.h>

#include "amplab/fused_layers.hpp"

namespace amplab {

MnistNetImpl::MnistNetImpl() {
  conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, /*kernel_size=*/3).stride(1)));
  conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, /*kernel_size=*/3).stride(1)));
  dropout1 = register_module("dropout1", torch::nn::Dropout(0.25));
  dropout2 = register_module("dropout2", torch::nn::Dropout(0.5));
  fc1 = register_module("fc1", torch::nn::Linear(9216, 128));  // 64 channels x 12 x 12 after pooling
  fc2 = register_module("fc2", torch::nn::Linear(128, 10));
}

torch::Tensor MnistNetImpl::forward(torch::Tensor x) {
  if (fused_kernels && x.is_cuda()) return forward_fused(x);
  x = torch::relu(conv1(x));                    // (N, 32, 26, 26)
  x = torch::relu(conv2(x));                    // (N, 64, 24, 24)
  x = torch::max_pool2d(x, /*kernel_size=*/2);  // (N, 64, 12, 12)
  return classify(x);
}

torch::Tensor MnistNetImpl::forward_fused(torch::Tensor x) {
  x = conv3x3_bias_relu(x, conv1->weight, conv1->bias);                   // (N, 32, 26, 26)
  x = bias_relu_max_pool2(torch::conv2d(x, conv2->weight), conv2->bias);  // (N, 64, 12, 12)
  return classify(x);  // cuBLAS already adds fc1's bias inside its matrix product: nothing to fuse there
}

torch::Tensor MnistNetImpl::classify(torch::Tensor x) {
  x = dropout1(x);
  x = torch::flatten(x, 1);  // (N, 9216)
  x = torch::relu(fc1(x));
  x = dropout2(x);
  x = fc2(x);  // (N, 10)
  return torch::log_softmax(x, /*dim=*/1);
}

torch::nn::Sequential make_mlp(int64_t width, int64_t layers) {
  torch::nn::Sequential mlp;
  for (int64_t i = 0; i < layers; ++i) {
    mlp->push_back(torch::nn::Linear(width, width));
    mlp->push_back(torch::nn::ReLU());
  }
  return mlp;
}

void to_channels_last(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters())
    if (p.dim() == 4) p.set_data(p.data().contiguous(torch::MemoryFormat::ChannelsLast));
}

}  // namespace amplab
