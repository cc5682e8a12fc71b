// The MNIST network with our kernels for its convolutions (fused_mnist_net.hpp).
#include "amplab/fast/fused_mnist_net.hpp"

#include <torch/torch.h>

#include "amplab/fast/fused_layers.hpp"

namespace amplab {

torch::Tensor FusedMnistNetImpl::forward(torch::Tensor x) {
  if (!x.is_cuda()) return MnistNetImpl::forward(x);
  x = mnist_features(x, conv1->weight, conv1->bias, conv2->weight, conv2->bias);  // (N, 64, 12, 12)
  x = torch::flatten(dropout1(x), 1);                                             // (N, 9216)
  x = linear(x, fc1->weight, fc1->bias);                                          // (N, 128), before its ReLU
  const double p = dropout2->is_training() ? dropout2->options.p() : 0.0;
  return mnist_head(x, fc2->weight, fc2->bias, p);  // ReLU, dropout, fc2, log-softmax
}

MnistNet make_fused_mnist_net() {
  std::shared_ptr<MnistNetImpl> net = std::make_shared<FusedMnistNetImpl>();
  return MnistNet(net);
}

}  // namespace amplab
