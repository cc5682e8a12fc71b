// Your copy of this lab's code: fill in every TODO(...) below; the tests tell you which one
// fails. (Instructors: generated from solution/ by scripts/make-starter.py; edit the solution.)
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
  AMPLAB_TODO("amp_training-6");
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
  AMPLAB_TODO("amp_training-7");
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
  AMPLAB_TODO("amp_training-7");
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
  AMPLAB_TODO("amp_training-8");
}

// TODO(amp_training-8): count, over all tensors, the elements where reference != 0 and
// grads == 0, and divide by the count of reference != 0. Different sizes: an amplab::Error.
double flushed_share(const std::vector<torch::Tensor>& reference, const std::vector<torch::Tensor>& grads) {
  AMPLAB_TODO("amp_training-8");
}

}  // namespace amp_training
