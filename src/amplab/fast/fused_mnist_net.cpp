// The MNIST network with our kernels for its convolutions (fused_mnist_net.hpp).
#include "amplab/fast/fused_mnist_net.hpp"

#include <torch/torch.h>

#include "amplab/fast/fused_layers.hpp"

namespace amplab {

torch::Tensor FusedMnistNetImpl::forward(torch::Tensor x) {
  if (!x.is_cuda()) return MnistNetImpl::forward(x);
  // dropout's probabilities as the modules would apply them: none in evaluation
  auto p = [](torch::nn::Dropout& dropout) { return dropout->is_training() ? dropout->options.p() : 0.0; };
  x = mnist_features(x, conv1->weight, conv1->bias, conv2->weight, conv2->bias, p(dropout1));  // (N, 64, 12, 12)
  x = linear(torch::flatten(x, 1), fc1->weight, fc1->bias);  // (N, 128), before its ReLU
  return mnist_head(x, fc2->weight, fc2->bias, p(dropout2));  // ReLU, dropout, fc2, log-softmax
}

MnistNet make_fused_mnist_net() {
  std::shared_ptr<MnistNetImpl> net = std::make_shared<FusedMnistNetImpl>();
  return MnistNet(net);
}

}  // namespace amplab
