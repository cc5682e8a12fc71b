#include "amplab/fast/fused_sgd.hpp"

#include <ATen/ops/_fused_sgd.h>
#include <torch/torch.h>

#include "amplab/infra/error.hpp"

namespace amplab {

FusedSGD::FusedSGD(const std::vector<torch::Tensor>& params, torch::optim::SGDOptions options)
    : FusedOptimizerOf<torch::optim::SGD>(params, options) {
  if (options.nesterov()) throw Error("train.optimizer: fused SGD is used without Nesterov momentum here");
}

void FusedSGD::fused_step(const std::optional<torch::Tensor>& grad_scale, const std::optional<torch::Tensor>& found_inf,
                          const ParameterSubset* only) {
  torch::NoGradGuard no_grad;
  for (auto& group : param_groups()) {
    auto& options = static_cast<torch::optim::SGDOptions&>(group.options());
    std::vector<torch::Tensor> params, grads, buffers;
    bool first_step = false;
    for (auto& p : group.params()) {
      if (!in_step(p, only)) continue;
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
    if (auto lr = lr_on(params.front().device()))
      at::_fused_sgd_(params, grads, buffers, options.weight_decay(), options.momentum(), *lr,
                      options.dampening(), options.nesterov(), /*maximize=*/false, first_step, grad_scale, found_inf);
    else
      at::_fused_sgd_(params, grads, buffers, options.weight_decay(), options.momentum(), options.lr(),
                      options.dampening(), options.nesterov(), /*maximize=*/false, first_step, grad_scale, found_inf);
  }
}

}  // namespace amplab
