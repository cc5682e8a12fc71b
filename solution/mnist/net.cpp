// Given code of the MNIST lab (no TODOs here): the network, its loss, the modes, evaluation.
#include "mnist.hpp"

namespace mnist {

NetImpl::NetImpl() {
  conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, /*kernel_size=*/3).stride(1)));
  conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, /*kernel_size=*/3).stride(1)));
  dropout1 = register_module("dropout1", torch::nn::Dropout(0.25));
  dropout2 = register_module("dropout2", torch::nn::Dropout(0.5));
  fc1 = register_module("fc1", torch::nn::Linear(9216, 128));  // 64 channels x 12 x 12 after pooling
  fc2 = register_module("fc2", torch::nn::Linear(128, 10));
}

torch::Tensor NetImpl::forward(torch::Tensor x) {
  x = torch::relu(conv1(x));                   // (N, 32, 26, 26)
  x = torch::relu(conv2(x));                   // (N, 64, 24, 24)
  x = torch::max_pool2d(x, /*kernel_size=*/2);  // (N, 64, 12, 12)
  x = dropout1(x);
  x = torch::flatten(x, 1);                    // (N, 9216)
  x = torch::relu(fc1(x));
  x = dropout2(x);
  x = fc2(x);                                  // (N, 10)
  return torch::log_softmax(x, /*dim=*/1);
}

torch::Tensor nll_loss(Net& net, const amplab::Batch& batch) {
  return torch::nll_loss(net->forward(batch.input), batch.target);
}

std::string Mode::label() const {
  return kind == "gpu-amp" ? kind + " (" + amplab::to_string(precision) + ")" : kind;
}

std::vector<Mode> expand_modes(const std::vector<std::string>& kinds, const std::vector<std::string>& amp_precisions) {
  std::vector<Mode> modes;
  for (const auto& kind : kinds) {
    if (kind != "gpu-amp") {
      modes.push_back({kind, amplab::Precision::fp32});
      continue;
    }
    for (const auto& name : amp_precisions)
      modes.push_back({kind, amplab::enum_from_string<amplab::Precision>(name, "mnist.amp_precisions")});
  }
  return modes;
}

Evaluation evaluate(Net& net, const ResidentSplit& split, int64_t batch_size, amplab::Precision precision) {
  torch::NoGradGuard no_grad;
  net->eval();
  torch::Device device = split.images.device();
  torch::Tensor correct = torch::zeros({}, torch::dtype(torch::kInt64).device(device));
  torch::Tensor loss_sum = torch::zeros({}, torch::dtype(torch::kFloat64).device(device));
  {
    amplab::AutocastGuard autocast(device, precision);
    for (int64_t start = 0; start < split.size(); start += batch_size) {
      int64_t n = std::min(batch_size, split.size() - start);
      torch::Tensor output = net->forward(split.images.narrow(0, start, n));
      torch::Tensor labels = split.labels.narrow(0, start, n);
      loss_sum += torch::nll_loss(output.to(torch::kFloat32), labels, {}, at::Reduction::Sum).to(torch::kFloat64);
      correct += output.argmax(1).eq(labels).sum();
    }
  }
  net->train();
  // One host sync for the whole evaluation.
  auto totals = torch::stack({correct.to(torch::kFloat64), loss_sum}).cpu();
  double n = static_cast<double>(split.size());
  return {totals[0].item<double>() / n, totals[1].item<double>() / n};
}

}  // namespace mnist
