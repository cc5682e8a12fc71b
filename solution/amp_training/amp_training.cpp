// Lab 2, AMP training. Each TODO below is one exercise; see labs/amp_training/README.md.
#include "amp_training.hpp"

#include "amplab/device.hpp"
#include "amplab/error.hpp"
#include "amplab/grad_clip.hpp"
#include "amplab/memory.hpp"

namespace amp_training {

amplab::GradScaler make_grad_scaler(amplab::Precision precision, const std::string& loss_scaling,
                                    const amplab::GradScalerConfig& config) {
  if (loss_scaling != "auto" && loss_scaling != "on" && loss_scaling != "off")
    throw amplab::Error("train.loss_scaling: '" + loss_scaling + "' is not allowed; use one of: auto, on, off");
  amplab::GradScalerConfig chosen = config;
  // TODO(amp_training-2): Decide chosen.enabled: true when loss_scaling is "on", or when it is
  // "auto" and the precision needs loss scaling (amplab::needs_loss_scaling: fp16-mixed only;
  // bf16 has fp32's exponent range, so its gradients do not underflow); false otherwise.
  // BEGIN SOLUTION
  chosen.enabled = loss_scaling == "on" || (loss_scaling == "auto" && amplab::needs_loss_scaling(precision));
  // END SOLUTION
  return amplab::GradScaler(chosen);
}

AmpTraining::AmpTraining(std::shared_ptr<torch::nn::Module> model_, amplab::LossFn loss_fn_,
                         const amplab::TrainConfig& config, torch::Device device_)
    : model(std::move(model_)),
      loss_fn(std::move(loss_fn_)),
      scaler(make_grad_scaler(config.precision, config.loss_scaling, config.grad_scaler)),
      precision(config.precision),
      grad_clip_norm(config.grad_clip_norm),
      device(device_),
      tf32_(config.precision == amplab::Precision::tf32) {
  amplab::check_supported(precision, device);
  amplab::check_on_device(*model, device);
  parameters = model->parameters();
  optimizer = amplab::make_optimizer(parameters, config.optimizer);
}

// ---- The training step --------------------------------------------------------------------
amplab::StepResult train_step(AmpTraining& t, const amplab::Batch& batch) {
  amplab::StepResult result;
  result.samples = batch.size();
  torch::Tensor loss;  // 0-dim float32: the batch's loss, unscaled

  // TODO(amp_training-1): The forward pass under autocast. In a block of its own, hold an
  // amplab::AutocastGuard(t.device, t.precision) and compute loss = t.loss_fn(batch): inside,
  // matmuls and convolutions run in fp16/bf16 on fp16/bf16 copies of the fp32 weights, while
  // reductions and the loss stay fp32 (for fp32/tf32 the guard does nothing). Close the block
  // before backward: backward ops run in the dtype that autocast chose for their forward op.
  // BEGIN SOLUTION
  {
    amplab::AutocastGuard autocast(t.device, t.precision);
    loss = t.loss_fn(batch);
  }
  // END SOLUTION

  // TODO(amp_training-3): Backward of the *scaled* loss: t.scaler.scale(loss) multiplies it by
  // the loss scale S (65536 at first), so every gradient comes out S times larger and the small
  // ones survive fp16 instead of flushing to zero. A disabled scaler returns the loss as it is.
  // BEGIN SOLUTION
  t.scaler.scale(loss).backward();
  // END SOLUTION

  // TODO(amp_training-4): Clipping, when t.grad_clip_norm > 0: amplab::clip_grad_norm_(t.parameters,
  // t.grad_clip_norm) clips in place and returns the norm before clipping; keep it in
  // result.grad_norm. The gradients are still S times too large here: unscale them first with
  // t.scaler.unscale_(*t.optimizer), or the norm is S times too large and the clip shrinks every
  // update by S. Without clipping, do not unscale here: step() does it, and a fused optimizer
  // divides inside its own kernel, saving a pass over all gradients.
  // BEGIN SOLUTION
  if (t.grad_clip_norm > 0) {
    t.scaler.unscale_(*t.optimizer);
    result.grad_norm = amplab::clip_grad_norm_(t.parameters, t.grad_clip_norm);
  }
  // END SOLUTION

  // TODO(amp_training-5): The optimizer step through the scaler, then the scale update:
  // t.scaler.step(*t.optimizer) steps unless a gradient is inf/NaN, and t.scaler.update() then
  // halves S after an overflow or doubles it after growth_interval clean steps. With the scaler
  // enabled, report the skip as result.skipped = t.scaler.found_inf().clamp_max(1.0): a device
  // tensor, read later (an .item() here would wait for the GPU every step).
  // BEGIN SOLUTION
  t.scaler.step(*t.optimizer);
  if (t.scaler.is_enabled()) result.skipped = t.scaler.found_inf().clamp_max(1.0);
  t.scaler.update();
  // END SOLUTION

  t.optimizer->zero_grad(/*set_to_none=*/true);  // the next backward writes fresh gradients
  result.loss = loss.detach();
  return result;
}

// ---- Measuring ----------------------------------------------------------------------------
StepStats measure_steps(const std::function<torch::Tensor()>& step, torch::Device device, int warmup, int repeats,
                        int window) {
  if (repeats < 1 || window < 1 || warmup < 0)
    throw amplab::Error("measure_steps: need warmup >= 0, repeats >= 1 and window >= 1");
  StepStats stats;
  std::vector<double> per_step_ms;  // one entry per timed window
  // TODO(amp_training-6): Reset the peak memory counter (amplab::reset_peak_memory), run `step`
  // warmup times, wait for the device (amplab::synchronize). Then for each of `repeats` windows:
  // DeviceTimer::start(), `window` calls of step(), stop_ms() / window into per_step_ms. No host
  // sync inside a window: keep the last loss as a tensor. Afterwards set stats.peak_mib from
  // amplab::read_memory(device).peak_allocated (bytes; 1 MiB = 2^20 bytes) and stats.final_loss
  // from the last loss (.item<double>(): one sync, at the end). Then implement compare_to_fp32().
  // BEGIN SOLUTION
  amplab::reset_peak_memory(device);
  torch::Tensor loss;
  for (int i = 0; i < warmup; ++i) loss = step();
  amplab::synchronize(device);
  amplab::DeviceTimer timer(device);
  for (int r = 0; r < repeats; ++r) {
    timer.start();
    for (int i = 0; i < window; ++i) loss = step();
    per_step_ms.push_back(timer.stop_ms() / window);
  }
  stats.peak_mib = static_cast<double>(amplab::read_memory(device).peak_allocated) / (1 << 20);
  stats.final_loss = loss.item<double>();
  // END SOLUTION
  stats.step_ms = amplab::summarize(per_step_ms);
  return stats;
}

std::string PrecisionResult::label() const {
  std::string name = amplab::to_string(precision);
  if (amplab::needs_loss_scaling(precision) && !loss_scaling) name += " (no scaler)";
  if (!amplab::needs_loss_scaling(precision) && loss_scaling) name += " (scaler)";
  return name;
}

void compare_to_fp32(std::vector<PrecisionResult>& results) {
  // TODO(amp_training-6): For every result that ran, find the result of the same model with
  // precision fp32 that ran; set speedup_vs_fp32 = its median ms per step / this one's, and
  // memory_vs_fp32 = this peak_mib / its peak_mib (so fp32 itself gets 1 and 1). Leave both at 0
  // when the model has no fp32 result that ran.
  // BEGIN SOLUTION
  for (auto& r : results) {
    if (!r.ran) continue;
    for (const auto& base : results) {
      if (!base.ran || base.model != r.model || base.precision != amplab::Precision::fp32) continue;
      if (r.stats.step_ms.median > 0) r.speedup_vs_fp32 = base.stats.step_ms.median / r.stats.step_ms.median;
      if (base.stats.peak_mib > 0) r.memory_vs_fp32 = r.stats.peak_mib / base.stats.peak_mib;
      break;
    }
  }
  // END SOLUTION
}

}  // namespace amp_training
