// SGD through PyTorch's fused kernel (torch.optim.SGD(fused=True)): one kernel updates every
// parameter, and with a GradScaler it unscales and skips on the device (grad_scale and
// found_inf inputs), so an fp16 step needs no host synchronisation and can be captured in a
// CUDA graph. State and checkpoints are those of torch::optim::SGD.
#pragma once

#include <torch/optim/sgd.h>

#include <optional>

namespace amplab {

// Optimizers that take the loss scale and the inf flag themselves (GradScaler::step uses this).
class AmpScalingOptimizer {
 public:
  virtual ~AmpScalingOptimizer() = default;
  // grad_scale: divide gradients by it before using them (nullopt: already unscaled).
  // found_inf: a 0-dim float tensor; when it is non-zero the step leaves everything unchanged.
  virtual void step_with_amp_scaling(const std::optional<torch::Tensor>& grad_scale, const torch::Tensor& found_inf) = 0;
};

class FusedSGD : public torch::optim::SGD, public AmpScalingOptimizer {
 public:
  FusedSGD(const std::vector<torch::Tensor>& params, torch::optim::SGDOptions options);
  torch::Tensor step(LossClosure closure = nullptr) override;
  void step_with_amp_scaling(const std::optional<torch::Tensor>& grad_scale, const torch::Tensor& found_inf) override;

  // Sets every group's learning rate. On a GPU the value also goes into a device tensor that the
  // kernel reads from then on, so that a step captured in a CUDA graph follows a schedule (a
  // plain number would be frozen into the graph). Once called, change the rate only through it.
  void set_lr(double lr);

 private:
  void fused_step(const std::optional<torch::Tensor>& grad_scale, const std::optional<torch::Tensor>& found_inf);
  torch::Tensor lr_on_device_;  // 0-dim float32 on the parameters' GPU, after set_lr (undefined before)
};

}  // namespace amplab
