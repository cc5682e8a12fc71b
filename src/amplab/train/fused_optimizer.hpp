// The optimizer a GradScaler can hand the loss scale and found_inf on the device: what PyTorch's
// fused optimizers (torch.optim.SGD/AdamW(fused=True)) add to an optimizer, one kernel for every
// parameter which unscales fp16 gradients and skips an overflowed step on the device, and which
// can read its learning rate from a device tensor. Both make a whole training step capturable as
// a CUDA graph: no host decision, and a schedule the replays follow. The contract lives here, with
// the trainer and the loss scaler that use it; the implementations (FusedSGD, FusedAdamW) are the
// fast path's, in src/amplab/fast/.
#pragma once

#include <torch/types.h>

#include <optional>
#include <vector>

namespace amplab {

class FusedOptimizer {
 public:
  virtual ~FusedOptimizer() = default;
  // grad_scale: divide gradients by it before using them (nullopt: already unscaled).
  // found_inf: a 0-dim float tensor; when it is non-zero the step leaves everything unchanged.
  // GradScaler::step calls this instead of step().
  virtual void step_with_amp_scaling(const std::optional<torch::Tensor>& grad_scale, const torch::Tensor& found_inf) = 0;
  // Sets every group's learning rate. On a GPU the value also goes into a device tensor that the
  // kernel reads from then on, so that a step captured in a CUDA graph follows a schedule (a
  // plain number would be frozen into the graph). Once called, change the rate only through it.
  virtual void set_lr(double lr) = 0;
  // A step of these parameters only (each one of the optimizer's), without loss scaling: the same
  // update they get from a whole step, since every parameter is updated on its own. DDP steps each
  // bucket with it as soon as the bucket's all-reduce is done (Trainer::step, lab 5's DDP).
  virtual void step_parameters(const std::vector<torch::Tensor>& params) = 0;
};

}  // namespace amplab
