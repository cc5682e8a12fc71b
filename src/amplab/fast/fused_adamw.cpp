#include "amplab/fast/fused_adamw.hpp"

#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_sub.h>
#include <ATen/ops/_fused_adamw.h>
#include <torch/torch.h>

#if AMPLAB_WITH_CUDA
#include "amplab/fast/cuda/fused_adamw_launch.hpp"
#endif

namespace amplab {

torch::optim::AdamWParamState& FusedAdamW::state_of(const torch::Tensor& p, const torch::optim::AdamWOptions& options) {
  auto key = p.unsafeGetTensorImpl();
  auto it = state_.find(key);
  if (it == state_.end()) {
    auto state = std::make_unique<torch::optim::AdamWParamState>();
    state->step(0);
    state->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    state->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    if (options.amsgrad()) state->max_exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    it = state_.emplace(key, std::move(state)).first;
  }
  return static_cast<torch::optim::AdamWParamState&>(*it->second);
}

void FusedAdamW::fused_step(const std::optional<torch::Tensor>& grad_scale, const std::optional<torch::Tensor>& found_inf,
                            const ParameterSubset* only) {
  torch::NoGradGuard no_grad;
  for (auto& group : param_groups()) {
    auto& options = static_cast<torch::optim::AdamWOptions&>(group.options());
    std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
    for (auto& p : group.params()) {
      if (!in_step(p, only)) continue;
      auto& state = state_of(p, options);
      torch::Tensor& step = steps_[p.unsafeGetTensorImpl()];
      if (!step.defined())  // first step, or the first after load(): the count comes from the state
        step = torch::full({}, static_cast<float>(state.step()), torch::dtype(torch::kFloat32).device(p.device()));
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avgs.push_back(state.exp_avg());
      exp_avg_sqs.push_back(state.exp_avg_sq());
      if (options.amsgrad()) max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
      steps.push_back(step);
    }
    if (params.empty()) continue;
    auto [beta1, beta2] = options.betas();
    at::_foreach_add_(steps, 1);  // PyTorch counts first, then steps with the new count
    auto lr = lr_on(params.front().device());
    bool chunked = false;  // on a GPU: PyTorch's AdamW arithmetic over chunks sized to the model
#if AMPLAB_WITH_CUDA
    chunked = cuda::can_run_fused_adamw_chunked(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs);
    if (chunked) {
      cuda::AdamWHyper hyper{options.lr(), beta1, beta2, options.weight_decay(), options.eps(), options.amsgrad()};
      cuda::fused_adamw_chunked(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr.value_or(torch::Tensor()),
                                hyper, grad_scale, found_inf);
    }
#endif
    if (!chunked && lr)
      at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, *lr, beta1, beta2,
                        options.weight_decay(), options.eps(), options.amsgrad(), /*maximize=*/false, grad_scale, found_inf);
    else if (!chunked)
      at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, options.lr(), beta1, beta2,
                        options.weight_decay(), options.eps(), options.amsgrad(), /*maximize=*/false, grad_scale, found_inf);
    if (found_inf) at::_foreach_sub_(steps, std::vector<torch::Tensor>(steps.size(), *found_inf));  // a skipped step does not count
  }
}

void FusedAdamW::copy_steps_to_state() const {
  for (const auto& [key, step] : steps_) {
    auto it = state_.find(key);
    if (it != state_.end())
      static_cast<torch::optim::AdamWParamState&>(*it->second).step(static_cast<int64_t>(step.item<float>()));
  }
}

void FusedAdamW::save(torch::serialize::OutputArchive& archive) const {
  copy_steps_to_state();
  torch::optim::AdamW::save(archive);
}

void FusedAdamW::load(torch::serialize::InputArchive& archive) {
  torch::optim::AdamW::load(archive);
  steps_.clear();
}

}  // namespace amplab
