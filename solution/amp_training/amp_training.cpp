// Lab 2, AMP training: the scaler factory, the step and the underflow measurement (the GradScaler
// is grad_scaler.cpp). Each
// TODO is one function; see labs/amp_training/README.md.
#include "amp_training.hpp"

#include <ATen/autocast_mode.h>

#include "amplab/infra/error.hpp"
#include "amplab/train/grad_clip.hpp"

namespace amp_training {

// TODO(amp_training-6): enabled when config.loss_scaling is "on", or when it is "auto" and the
// precision is one whose gradients underflow (amplab::needs_loss_scaling: fp16's 5 exponent bits;
// bf16 has fp32's 8 and needs none). config.loss_scaling other than auto|on|off is an
// amplab::Error naming train.loss_scaling and the allowed values.
std::unique_ptr<amplab::LossScaler> make_loss_scaler(const amplab::TrainConfig& config) {
  // BEGIN SOLUTION
  const std::string& mode = config.loss_scaling;
  if (mode != "auto" && mode != "on" && mode != "off")
    throw amplab::Error("train.loss_scaling: '" + mode + "' is not allowed; use one of: auto, on, off");
  amplab::GradScalerConfig chosen = config.grad_scaler;
  chosen.enabled = mode == "on" || (mode == "auto" && amplab::needs_loss_scaling(config.precision));
  return std::make_unique<GradScaler>(chosen);
  // END SOLUTION
}

// TODO(amp_training-7): one mixed-precision step, top to bottom:
//  1. the loss, from trainer.forward_loss(batch) (given: forward pass + loss, the memory
//     tracker's phases, data-parallel hooks), under an amplab::AutocastGuard for the trainer's
//     device and precision: matmuls and convolutions run in fp16/bf16 on casts of the fp32
//     weights, reductions and the loss stay fp32. Close the guard before backward: backward ops
//     run in the dtype autocast chose for their forward op.
//  2. backward of the *scaled* loss (trainer.scaler()), so small fp16 gradients survive;
//  3. optimizer_step(trainer).
// Return its result with the loss (detached, 0-dim, on the device) and samples filled in.
// Pitfall: never .item() in a step: each one makes the host wait for the GPU.
amplab::StepResult train_step(amplab::Trainer& trainer, const amplab::Batch& batch) {
  // BEGIN SOLUTION
  torch::Tensor loss;
  {
    amplab::AutocastGuard autocast(trainer.device(), trainer.precision());
    loss = trainer.forward_loss(batch);
  }
  trainer.scaler().scale(loss).backward();
  amplab::StepResult result = optimizer_step(trainer);
  result.loss = loss.detach();
  result.samples = batch.size();
  return result;
  // END SOLUTION
}

// TODO(amp_training-7): the optimizer half, once backward has left scaled gradients in .grad.
// Tell the trainer the gradients are ready before anything reads them (gradients_ready: given,
// data-parallel training averages them across ranks there). Clipping (when the config asks for a
// clip norm; amplab::clip_grad_norm_ returns the norm before clipping, for result.grad_norm) must
// see the true gradients: clipping scaled ones sees a norm S times too large and shrinks every
// update by S. Without clipping, leave the unscaling to the scaler's step (a fused optimizer
// divides inside its own kernel). Then the scaler's step and update. With loss scaling,
// result.skipped is a 0-dim float32 device tensor, 1 when the step was skipped.
// Pitfall: found_inf() may count several overflows, and skipped is a 0-or-1 flag.
amplab::StepResult optimizer_step(amplab::Trainer& trainer) {
  // BEGIN SOLUTION
  amplab::StepResult result;
  trainer.gradients_ready();
  amplab::LossScaler& scaler = trainer.scaler();
  if (trainer.config().grad_clip_norm > 0) {
    scaler.unscale_(trainer.optimizer());
    result.grad_norm = amplab::clip_grad_norm_(trainer.parameters(), trainer.config().grad_clip_norm);
  }
  scaler.step(trainer.optimizer());
  if (scaler.is_enabled()) result.skipped = scaler.found_inf().clamp_max(1.0);
  scaler.update();
  return result;
  // END SOLUTION
}

// TODO(amp_training-8): the gradients one backward gives under autocast in `dtype` (none: fp32,
// autocast off) with the loss multiplied by loss_scale, brought back to the unscaled values: one
// detached fp32 tensor per parameter, in parameter order, zeros where a parameter got no
// gradient. Start and end with cleared gradients, so that calls do not add up. amplab::AutocastGuard
// takes a device type, a dtype and whether it is enabled (read its header for a disabled guard).
// Pitfall: dividing afterwards is what brings the values back; a gradient that was already zero
// in fp16 stays zero, which is the point of the measurement.
std::vector<torch::Tensor> gradients_under(torch::nn::Module& model, const amplab::LossFn& loss_fn,
                                           const amplab::Batch& batch, std::optional<torch::ScalarType> dtype,
                                           double loss_scale, torch::Device device) {
  // BEGIN SOLUTION
  model.zero_grad(/*set_to_none=*/true);
  torch::Tensor loss;
  {
    amplab::AutocastGuard autocast(device.type(), dtype.value_or(at::autocast::get_autocast_dtype(device.type())),
                                   /*enabled=*/dtype.has_value());
    loss = loss_fn(batch);
  }
  (loss * loss_scale).backward();
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (auto& p : model.parameters())
    grads.push_back(p.grad().defined() ? (p.grad().to(torch::kFloat32) / loss_scale).detach() : torch::zeros_like(p));
  model.zero_grad(/*set_to_none=*/true);
  return grads;
  // END SOLUTION
}

// TODO(amp_training-8): count, over all tensors, the elements where reference != 0 and
// grads == 0, and divide by the count of reference != 0. Different sizes: an amplab::Error.
double flushed_share(const std::vector<torch::Tensor>& reference, const std::vector<torch::Tensor>& grads) {
  // BEGIN SOLUTION
  if (reference.size() != grads.size()) throw amplab::Error("flushed_share: the two lists have different lengths");
  torch::NoGradGuard no_grad;
  int64_t lost = 0, nonzero = 0;
  for (size_t i = 0; i < reference.size(); ++i) {
    if (!reference[i].sizes().equals(grads[i].sizes()))
      throw amplab::Error("flushed_share: tensor " + std::to_string(i) + " has different shapes in the two lists");
    torch::Tensor alive = reference[i] != 0;
    nonzero += alive.sum().item<int64_t>();
    lost += (alive & (grads[i] == 0)).sum().item<int64_t>();
  }
  return nonzero > 0 ? static_cast<double>(lost) / static_cast<double>(nonzero) : 0.0;
  // END SOLUTION
}

}  // namespace amp_training
