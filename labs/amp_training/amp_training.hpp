// Lab 2, AMP training: the functions you implement (starter/amp_training/*.cpp). You write the
// GradScaler (grad_scaler.hpp) and the mixed-precision training step; the core's trainer runs
// them in every lab that trains (amplab/train/step.hpp: the MNIST lab trains with your step), and the lab
// binary (apps/amp_training) trains the same models with them in fp32, tf32, fp16-mixed and
// bf16-mixed, measures what each buys and why fp16 needs the scaler; tests/labs/
// amp_training_test.cpp grades them.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "amplab/infra/error.hpp"  // AMPLAB_TODO in the starter
#include "amplab/train/loss_scaler.hpp"
#include "amplab/train/precision.hpp"
#include "amplab/train/trainer.hpp"  // Trainer, TrainConfig, Batch, StepResult
#include "grad_scaler.hpp"

namespace amp_training {

// TODO(amp_training-6): the loss scaler a training config asks for (the trainer makes its scaler
// with it): a GradScaler with config.grad_scaler's settings, enabled when
// config.loss_scaling is "on", or "auto" and the precision needs it; disabled otherwise.
std::unique_ptr<amplab::LossScaler> make_loss_scaler(const amplab::TrainConfig& config);

// TODO(amp_training-7): one training step on one batch (what Trainer::step runs), and its
// optimizer half (optimizer_step), which gradient accumulation (lab 3) reuses.
amplab::StepResult train_step(amplab::Trainer& trainer, const amplab::Batch& batch);
amplab::StepResult optimizer_step(amplab::Trainer& trainer);

// TODO(amp_training-8): why fp16 needs loss scaling, measured. The gradients of `loss_fn` on
// `batch`, computed as a mixed-precision step computes them: the forward under autocast to
// `dtype` (std::nullopt: plain fp32), backward of the loss times `loss_scale`, each gradient then
// divided by `loss_scale`. One fp32 tensor per parameter, in model.parameters() order; .grad is
// left cleared.
std::vector<torch::Tensor> gradients_under(torch::nn::Module& model, const amplab::LossFn& loss_fn,
                                           const amplab::Batch& batch, std::optional<torch::ScalarType> dtype,
                                           double loss_scale, torch::Device device);
// The share (0..1) of the elements that are non-zero in `reference` and zero in `grads` (the same
// shapes): the gradients that flushed to zero. 0 when `reference` has no non-zero element.
double flushed_share(const std::vector<torch::Tensor>& reference, const std::vector<torch::Tensor>& grads);

}  // namespace amp_training
