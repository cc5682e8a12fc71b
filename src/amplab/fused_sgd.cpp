#include "amplab/fused_sgd.hpp"

#include <ATen/ops/_fused_sgd.h>
#include <torch/torch.h>

#include "amplab/error.hpp"

namespace amplab {

FusedSGD::FusedSGD(const std::vector<torch::Tensor>& params, torch::optim::SGDOptions options)
    : torch::optim::SGD(params, options) {
  if (options.nesterov()) throw Error("train.optimizer: fused SGD is used without Nesterov momentum here");
}

torch::Tensor FusedSGD::step(LossClosure closure) {
  torch::Tensor loss;
  if (closure) {
    torch::AutoGradMode enable(true);
    loss = closure();
  }
  fused_step(std::nullopt, std::nullopt);
  return loss;
}

void FusedSGD::step_with_amp_scaling(const std::optional<torch::Tensor>& grad_scale, const torch::Tensor& found_inf) {
  fused_step(grad_scale, found_inf);
}

void FusedSGD::step_parameters(const std::vector<torch::Tensor>& params) {
  ParameterSubset only = subset_of(params);
  fused_step(std::nullopt, std::nullopt, &only);
}

void FusedSGD::set_lr(double lr) {
  torch::Device device = torch::kCPU;
  for (auto& group : param_groups()) {
    group.options().set_lr(lr);
    if (!group.params().empty()) device = group.params().front().device();
  }
  store_lr_on_device(lr_on_device_, lr, device);
}

void FusedSGD::fused_step(const std::optional<torch::Tensor>& grad_scale, const std::optional<torch::Tensor>& found_inf,
                          const ParameterSubset* only) {
  torch::NoGradGuard no_grad;
  for (auto& group : param_groups()) {
    auto& options = static_cast<torch::optim::SGDOptions&>(group.options());
    std::vector<torch::Tensor> params, grads, buffers;
    bool first_step = false;
    for (auto& p : group.params()) {
      if (!p.grad().defined() || (only && !only->count(p.unsafeGetTensorImpl()))) continue;
      params.push_back(p);
      grads.push_back(p.grad());
      if (options.momentum() != 0) {
        auto key = p.unsafeGetTensorImpl();
        auto it = state_.find(key);
        if (it == state_.end()) {
          // PyTorch allocates the buffers uninitialised and lets the kernel fill them on the first step.
          auto state = std::make_unique<torch::optim::SGDParamState>();
          state->momentum_buffer(torch::empty_like(p.grad()));
          buffers.push_back(state->momentum_buffer());
          state_[key] = std::move(state);
          first_step = true;
        } else {
          buffers.push_back(static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer());
        }
      }
    }
    if (params.empty()) continue;
    if (lr_on_device_.defined() && lr_on_device_.device() == params.front().device())
      at::_fused_sgd_(params, grads, buffers, options.weight_decay(), options.momentum(), lr_on_device_,
                      options.dampening(), options.nesterov(), /*maximize=*/false, first_step, grad_scale, found_inf);
    else
      at::_fused_sgd_(params, grads, buffers, options.weight_decay(), options.momentum(), options.lr(),
                      options.dampening(), options.nesterov(), /*maximize=*/false, first_step, grad_scale, found_inf);
  }
}

}  // namespace amplab
