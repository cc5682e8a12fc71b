// SGD through PyTorch's fused kernel (torch.optim.SGD(fused=True)): one kernel updates every
// parameter, and with a GradScaler it unscales and skips on the device (grad_scale and
// found_inf inputs), so an fp16 step needs no host synchronisation and can be captured in a
// CUDA graph. State and checkpoints are those of torch::optim::SGD.
#pragma once

#include <torch/optim/sgd.h>

#include <optional>

#include "amplab/fused_optimizer.hpp"

namespace amplab {

class FusedSGD : public torch::optim::SGD, public FusedOptimizer {
 public:
  FusedSGD(const std::vector<torch::Tensor>& params, torch::optim::SGDOptions options);
  torch::Tensor step(LossClosure closure = nullptr) override;
  void step_with_amp_scaling(const std::optional<torch::Tensor>& grad_scale, const torch::Tensor& found_inf) override;

  void set_lr(double lr) override;
  void step_parameters(const std::vector<torch::Tensor>& params) override;

 private:
  void fused_step(const std::optional<torch::Tensor>& grad_scale, const std::optional<torch::Tensor>& found_inf,
                  const ParameterSubset* only = nullptr);
  torch::Tensor lr_on_device_;  // 0-dim float32 on the parameters' GPU, after set_lr (undefined before)
};

}  // namespace amplab
