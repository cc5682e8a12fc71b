// The fast path's implementation of the FusedOptimizer contract (src/amplab/train/fused_optimizer.hpp),
// shared by FusedSGD and FusedAdamW.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <optional>
#include <unordered_set>
#include <vector>

#include "amplab/train/fused_optimizer.hpp"

namespace amplab {

// The parameters a fused step is limited to (nullptr: all of them).
using ParameterSubset = std::unordered_set<const c10::TensorImpl*>;

// The part that does not depend on the update rule. FusedSGD and FusedAdamW derive from
// FusedOptimizerOf<torch::optim::SGD or AdamW>, keep that optimizer's state (and checkpoints),
// and supply fused_step: one launch of PyTorch's fused kernel over the parameters with a gradient.
template <class TorchOptimizer>
class FusedOptimizerOf : public TorchOptimizer, public FusedOptimizer {
 public:
  using TorchOptimizer::TorchOptimizer;

  torch::Tensor step(typename TorchOptimizer::LossClosure closure = nullptr) override {
    torch::Tensor loss;
    if (closure) {
      torch::AutoGradMode enable(true);
      loss = closure();
    }
    fused_step(std::nullopt, std::nullopt, nullptr);
    return loss;
  }

  void step_with_amp_scaling(const std::optional<torch::Tensor>& grad_scale, const torch::Tensor& found_inf) override {
    fused_step(grad_scale, found_inf, nullptr);
  }

  void step_parameters(const std::vector<torch::Tensor>& params) override {
    ParameterSubset only;
    for (const auto& p : params) only.insert(p.unsafeGetTensorImpl());
    fused_step(std::nullopt, std::nullopt, &only);
  }

  void set_lr(double lr) override {
    torch::Device device = torch::kCPU;
    for (auto& group : this->param_groups()) {
      group.options().set_lr(lr);
      if (!group.params().empty()) device = group.params().front().device();
    }
    if (!device.is_cuda()) return;  // the CPU kernels read the number each step; no graphs there
    if (!lr_on_device_.defined()) lr_on_device_ = torch::empty({}, torch::dtype(torch::kFloat32).device(device));
    lr_on_device_.fill_(lr);
  }

 protected:
  virtual void fused_step(const std::optional<torch::Tensor>& grad_scale, const std::optional<torch::Tensor>& found_inf,
                          const ParameterSubset* only) = 0;
  // Whether p takes part in this fused step: it has a gradient, and it is in `only` if given.
  static bool in_step(const torch::Tensor& p, const ParameterSubset* only) {
    return p.grad().defined() && (!only || only->count(p.unsafeGetTensorImpl()));
  }
  // The rate as a device tensor on `device` after set_lr, for the kernels' tensor-lr overload.
  std::optional<torch::Tensor> lr_on(const torch::Device& device) const {
    if (lr_on_device_.defined() && lr_on_device_.device() == device) return lr_on_device_;
    return std::nullopt;
  }

 private:
  torch::Tensor lr_on_device_;  // 0-dim float32 on the parameters' GPU, after set_lr (undefined before)
};

}  // namespace amplab
