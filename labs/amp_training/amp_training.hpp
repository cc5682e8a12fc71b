// Lab 2, AMP training: the functions you implement (starter/amp_training/amp_training.cpp).
// You write the mixed-precision training step yourself with the core's autocast guard and
// GradScaler; the lab binary (apps/amp_training) trains the same models with it in fp32, tf32,
// fp16-mixed and bf16-mixed and measures what each buys; tests/labs/amp_training_test.cpp
// grades your functions.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "amplab/error.hpp"  // AMPLAB_TODO in the starter
#include "amplab/grad_scaler.hpp"
#include "amplab/precision.hpp"
#include "amplab/timing.hpp"
#include "amplab/trainer.hpp"  // TrainConfig, Batch, LossFn, StepResult, make_optimizer

namespace amp_training {

// TODO(amp_training-2): the loss scaler a precision needs.
// Enabled when `loss_scaling` is "on", or "auto" and the precision is fp16-mixed (only fp16's
// narrow exponent range needs it); disabled otherwise, which makes every call on it a
// pass-through. The other settings (initial scale, growth and backoff) come from `config`.
// `loss_scaling` other than auto|on|off is an amplab::Error.
amplab::GradScaler make_grad_scaler(amplab::Precision precision, const std::string& loss_scaling,
                                    const amplab::GradScalerConfig& config);

// Given: everything one training step works on, built from the same amplab::TrainConfig as the
// core's amplab::Trainer (precision, loss_scaling, grad_clip_norm, optimizer, grad_scaler; one
// batch per step, so batch_size and accumulation_steps play no part here).
class AmpTraining {
 public:
  // Throws amplab::Error when the device cannot run the precision or the model is elsewhere.
  AmpTraining(std::shared_ptr<torch::nn::Module> model, amplab::LossFn loss_fn, const amplab::TrainConfig& config,
              torch::Device device);
  AmpTraining(const AmpTraining&) = delete;
  AmpTraining& operator=(const AmpTraining&) = delete;

  std::shared_ptr<torch::nn::Module> model;            // parameters stay fp32: autocast casts copies
  amplab::LossFn loss_fn;                              // forward pass + loss of a batch
  std::vector<torch::Tensor> parameters;               // model->parameters()
  std::unique_ptr<torch::optim::Optimizer> optimizer;  // amplab::make_optimizer(config.optimizer)
  amplab::GradScaler scaler;                           // make_grad_scaler(...) for the precision
  amplab::Precision precision;
  double grad_clip_norm;                               // clip the gradients' 2-norm to this (0: off)
  torch::Device device;

 private:
  amplab::Tf32Guard tf32_;  // TF32 matmuls only for precision tf32, while this object lives
};

// TODO(amp_training-1), TODO(amp_training-3), TODO(amp_training-4), TODO(amp_training-5):
// one mixed-precision training step, top to bottom: forward under autocast, backward of the
// scaled loss, unscale + clip, step (or skip) through the scaler, scale update, zero grads.
// Returns the unscaled loss (0-dim float32, on the device: no host sync), the gradient norm
// before clipping (undefined without clipping) and, with loss scaling, `skipped` (0-dim
// float32, 1 when the step was skipped for inf/NaN gradients).
amplab::StepResult train_step(AmpTraining& training, const amplab::Batch& batch);

// TODO(amp_training-6): speed and memory of one precision.
struct StepStats {
  amplab::Summary step_ms;  // milliseconds per step: one sample per timed window (window time / steps)
  double peak_mib = 0;      // peak memory from warm-up to the end (GPU: allocated by tensors; CPU: process RSS)
  double final_loss = NAN;  // loss of the last step
};
// Runs `step` `warmup` times untimed, then `repeats` timed windows of `window` steps each, timed
// as a whole with an amplab::DeviceTimer (CUDA events on a GPU) and divided by `window`. `step`
// queues one training step and returns its loss as a device tensor; reading it (a host sync)
// happens once, after the last step.
StepStats measure_steps(const std::function<torch::Tensor()>& step, torch::Device device, int warmup, int repeats,
                        int window);

// One row of the comparison: a model trained in one precision.
struct PrecisionResult {
  std::string model;                                  // "mlp" or "cnn"
  amplab::Precision precision = amplab::Precision::fp32;
  bool loss_scaling = false;                          // the GradScaler was enabled
  bool ran = false;
  std::string skipped_because;                        // why it did not run ("" when it ran)
  StepStats stats;
  double samples_per_second = 0;
  double tflops = 0;                                  // achieved TFLOP/s (0 where the FLOPs are not counted)
  double peak_fraction = 0;                           // tflops / the measured matmul peak
  double speedup_vs_fp32 = 0;                         // fp32's median ms / this median ms (0: no fp32 to compare)
  double memory_vs_fp32 = 0;                          // this peak / fp32's peak (0: no fp32 to compare)
  std::string label() const;                          // "bf16-mixed", "fp16-mixed (no scaler)"
};
// Sets speedup_vs_fp32 and memory_vs_fp32 of every result that ran, against the fp32 result of
// the same model; both stay 0 where that model has no fp32 result that ran.
void compare_to_fp32(std::vector<PrecisionResult>& results);

}  // namespace amp_training
