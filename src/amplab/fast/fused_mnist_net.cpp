// The MNIST network with our kernels for its convolutions (fused_mnist_net.hpp).
#include "amplab/fast/fused_mnist_net.hpp"

#include <torch/torch.h>

#include "amplab/fast/fused_layers.hpp"

namespace amplab {

torch::Tensor FusedMnistNetImpl::forward(torch::Tensor x) {
  if (!x.is_cuda()) return MnistNetImpl::forward(x);
  x = mnist_features(x, conv1->weight, conv1->bias, conv2->weight, conv2->bias);  // (N, 64, 12, 12)
  return classify(x);
}

torch::Tensor FusedMnistNetImpl::linear(torch::nn::Linear& layer, const torch::Tensor& x) {
  return amplab::linear(x, layer->weight, layer->bias);
}

MnistNet make_fused_mnist_net() {
  std::shared_ptr<MnistNetImpl> net = std::make_shared<FusedMnistNetImpl>();
  return MnistNet(net);
}

}  // namespace amplab
