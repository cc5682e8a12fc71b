// Gradient-norm clipping with PyTorch's numerics (grad_clip.hpp).
#include "amplab/train/grad_clip.hpp"

#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <torch/torch.h>

namespace amplab {

namespace {
std::vector<torch::Tensor> gradients_of(const std::vector<torch::Tensor>& parameters) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : parameters)
    if (p.grad().defined()) grads.push_back(p.grad());
  return grads;
}
}  // namespace

torch::Tensor total_grad_norm(const std::vector<torch::Tensor>& parameters) {
  torch::NoGradGuard no_grad;
  auto grads = gradients_of(parameters);
  if (grads.empty()) return torch::zeros({});
  // PyTorch groups by device and dtype; our models keep all gradients on one device and dtype.
  auto norms = at::_foreach_norm(grads, 2.0);
  std::vector<torch::Tensor> on_first;
  for (auto& n : norms) on_first.push_back(n.to(grads[0].device()));
  return torch::linalg_vector_norm(torch::stack(on_first), 2.0, c10::nullopt, false, c10::nullopt);
}

torch::Tensor clip_grad_norm_(const std::vector<torch::Tensor>& parameters, double max_norm) {
  torch::NoGradGuard no_grad;
  auto grads = gradients_of(parameters);
  torch::Tensor total = total_grad_norm(parameters);
  if (grads.empty()) return total;
  // Python evaluates `max_norm / (total + 1e-6)` as reciprocal() * max_norm; so do we, to the bit.
  torch::Tensor clip_coef = (total + 1e-6).reciprocal() * max_norm;
  // Multiplying by a clamped coefficient instead of branching on it avoids a host sync.
  torch::Tensor clip_coef_clamped = torch::clamp(clip_coef, c10::nullopt, 1.0);
  at::_foreach_mul_(grads, clip_coef_clamped.to(grads[0].device()));
  return total;
}

}  // namespace amplab
