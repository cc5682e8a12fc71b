// The dtype census (dtype_census.hpp).
#include "dtype_census.hpp"

#include <torch/torch.h>

namespace amp_training {

std::string dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat32: return "float32";
    case torch::kBFloat16: return "bfloat16";
    case torch::kFloat16: return "float16";
    case torch::kFloat64: return "float64";
    default: return c10::toString(dtype);
  }
}

std::vector<CensusEntry> autocast_dtype_census(torch::Device device, amplab::Precision precision) {
  amplab::check_supported(precision, device);
  torch::manual_seed(0);
  torch::nn::Linear fc1(torch::nn::LinearOptions(16, 10).bias(false));
  torch::nn::LayerNorm ln(torch::nn::LayerNormOptions({10}));
  torch::nn::Linear fc2(torch::nn::LinearOptions(10, 4).bias(false));
  fc1->to(device);
  ln->to(device);
  fc2->to(device);
  const torch::Tensor x = torch::randn({8, 16}, device);
  const torch::Tensor target = torch::randint(0, 4, {8}, torch::TensorOptions().dtype(torch::kInt64).device(device));

  std::vector<CensusEntry> census{{"x (the input)", x.scalar_type()}, {"fc1.weight", fc1->weight.scalar_type()}};
  torch::Tensor loss;
  {
    amplab::AutocastGuard autocast(device, precision);
    const torch::Tensor h = fc1(x), r = torch::relu(h), n = ln(r), logits = fc2(n);
    loss = torch::nn::functional::cross_entropy(logits, target);
    census.insert(census.end(), {{"fc1(x)", h.scalar_type()},
                                 {"relu(fc1(x))", r.scalar_type()},
                                 {"layer_norm(relu(...))", n.scalar_type()},
                                 {"fc2(...): the logits", logits.scalar_type()},
                                 {"cross_entropy: the loss", loss.scalar_type()}});
  }
  loss.backward();
  census.insert(census.end(), {{"fc1.weight.grad", fc1->weight.grad().scalar_type()},
                               {"layer_norm.weight.grad", ln->weight.grad().scalar_type()}});
  return census;
}

}  // namespace amp_training
