// Lab 2: your GradScaler (starter/amp_training/grad_scaler.cpp), torch.amp.GradScaler in C++.
// The core's training loop, checkpoints and CUDA graphs use it through amplab::LossScaler
// (src/amplab/train/loss_scaler.hpp); the tests replay PyTorch's own GradScaler on the same gradients
// and expect your scale, growth tracker, skips and parameters to the last bit.
//
// Why it exists (README.md has the whole story): fp16 flushes values below ~6e-8 to zero, and
// many gradients are that small. Multiplying the loss by a scale S before backward multiplies
// every gradient by S (the chain rule is linear), which lifts them into fp16's range; dividing by
// S before the optimizer step gives the true values back. Too large an S overflows to inf: then
// the step is skipped and S shrinks. S grows again after a run of clean steps.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <vector>

#include "amplab/train/fused_optimizer.hpp"
#include "amplab/train/loss_scaler.hpp"

namespace amp_training {

class GradScaler final : public amplab::LossScaler {
 public:
  // Given. Throws amplab::Error unless growth_factor > 1 and backoff_factor < 1 (when enabled).
  explicit GradScaler(const amplab::GradScalerConfig& config = {});

  // TODO(amp_training-1). loss * scale.
  torch::Tensor scale(const torch::Tensor& loss) override;
  // TODO(amp_training-2). Divides the optimizer's gradients by the scale, in place, and records
  // whether any was inf/NaN.
  void unscale_(torch::optim::Optimizer& optimizer) override;
  // TODO(amp_training-3). Steps unless an inf/NaN was found; returns whether it stepped.
  bool step(torch::optim::Optimizer& optimizer) override;
  // TODO(amp_training-4). Backoff after an overflow, growth after growth_interval clean steps.
  void update() override;

  bool is_enabled() const override { return enabled_; }
  double get_scale() const override;       // given: init_scale before the first scale(), 1 when disabled
  int64_t growth_tracker() const override;  // given
  torch::Tensor found_inf() const override { return last_found_inf_; }

  // TODO(amp_training-5). What a checkpoint keeps, and putting it back.
  amplab::GradScalerState state() const override;
  void load_state(const amplab::GradScalerState& state) override;

  // TODO(amp_training-9), the stretch: whether step() decides the skip on the device for this
  // optimizer (then a whole training step can be captured as a CUDA graph).
  bool skips_on_device(const torch::optim::Optimizer& optimizer) const override;

 private:
  // Where each optimizer is between update()s: unscale_ and step are each allowed once.
  enum class Stage { ready, unscaled, stepped };
  struct OptimizerState {
    Stage stage = Stage::ready;
    torch::Tensor found_inf;  // 0-dim float32 on the scale's device: 1 when a gradient was inf/NaN
    bool on_device = false;   // stepped by step_on_device (the stretch)
  };

  // TODO(amp_training-9), the stretch: step() of a fused optimizer without a host sync, and the
  // scale's update and the unscaling in one kernel each for such optimizers.
  void step_on_device(torch::optim::Optimizer& optimizer, amplab::FusedOptimizer& fused);
  void update_on_device(const torch::Tensor& found_inf);
  void unscale_on_device(std::vector<torch::Tensor>& grads, torch::Tensor& found_inf, const torch::Tensor& inv_scale);

  bool enabled_;
  double init_scale_;
  double growth_factor_;
  double backoff_factor_;
  int64_t growth_interval_;
  int64_t init_growth_tracker_ = 0;  // what growth_tracker_ starts from (a loaded state's)
  torch::Tensor scale_;              // 0-dim float32, on the device of the first loss; undefined before
  torch::Tensor growth_tracker_;     // 0-dim int32, same device: clean steps since the last change
  std::map<const torch::optim::Optimizer*, OptimizerState> per_optimizer_;  // cleared by update()
  torch::Tensor last_found_inf_;     // what the last step() found (found_inf())
};

}  // namespace amp_training
