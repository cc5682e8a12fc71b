#include "amplab/trainer.hpp"

#include <algorithm>

#include <torch/torch.h>

#include "amplab/device.hpp"
#include "amplab/error.hpp"
#include "amplab/fused_adamw.hpp"
#include "amplab/fused_sgd.hpp"
#include "amplab/grad_clip.hpp"

namespace amplab {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<torch::Tensor>& parameters,
                                                        const OptimizerConfig& c) {
  if (c.name == "sgd") {
    auto options = torch::optim::SGDOptions(c.lr).momentum(c.momentum).weight_decay(c.weight_decay);
    if (c.fused) return std::make_unique<FusedSGD>(parameters, options);
    return std::make_unique<torch::optim::SGD>(parameters, options);
  }
  if (c.fused && c.name != "adamw")
    throw Error("train.optimizer.fused: there is no fused kernel for '" + c.name + "' here; fused works with sgd and adamw");
  if (c.name == "adam")
    return std::make_unique<torch::optim::Adam>(
        parameters, torch::optim::AdamOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(c.weight_decay));
  if (c.name == "adamw") {
    auto options = torch::optim::AdamWOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(c.weight_decay);
    if (c.fused) return std::make_unique<FusedAdamW>(parameters, options);
    return std::make_unique<torch::optim::AdamW>(parameters, options);
  }
  throw Error("train.optimizer.name: '" + c.name + "' is not allowed; use one of: sgd, adam, adamw");
}

double scheduled_lr(const OptimizerConfig& config, int64_t step, int64_t total_steps) {
  if (config.schedule != "constant" && config.schedule != "linear")
    throw Error("train.optimizer.schedule: '" + config.schedule + "' is not allowed; use one of: constant, linear");
  if (!(config.warmup >= 0 && config.warmup <= 0.5))
    throw Error("train.optimizer.warmup: " + std::to_string(config.warmup) + " is not allowed; use a fraction in [0, 0.5]");
  if (total_steps < 1) throw Error("scheduled_lr: the run has no steps");
  step = std::clamp<int64_t>(step, 0, total_steps);
  const auto warmup_steps = static_cast<int64_t>(config.warmup * static_cast<double>(total_steps));
  if (step < warmup_steps) return config.lr * (static_cast<double>(step) / static_cast<double>(warmup_steps));
  if (config.schedule == "constant") return config.lr;
  return config.lr * (static_cast<double>(total_steps - step) / static_cast<double>(total_steps - warmup_steps));
}

bool has_schedule(const OptimizerConfig& config) { return config.schedule != "constant" || config.warmup > 0; }

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  if (auto* fused = dynamic_cast<FusedOptimizer*>(&optimizer)) return fused->set_lr(lr);
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

namespace {
GradScalerConfig scaler_config_for(const TrainConfig& config) {
  GradScalerConfig scaler = config.grad_scaler;
  // auto: fp16 only; bf16 and fp32 have fp32's exponent range, so the scaler is a pass-through.
  scaler.enabled = config.loss_scaling == "on" || (config.loss_scaling == "auto" && needs_loss_scaling(config.precision));
  return scaler;
}
}  // namespace

Trainer::Trainer(std::shared_ptr<torch::nn::Module> model, LossFn loss_fn, const TrainConfig& config,
                 torch::Device device, const MemoryConfig& memory)
    : model_(std::move(model)),
      loss_fn_(std::move(loss_fn)),
      config_(config),
      device_(device),
      scaler_(scaler_config_for(config)),
      memory_(device, memory),
      tf32_(config.precision == Precision::tf32) {
  check_supported(config_.precision, device_);
  check_on_device(*model_, device_);
  parameters_ = model_->parameters();
  optimizer_ = make_optimizer(parameters_, config_.optimizer);
}

bool Trainer::steps_each_bucket() {
  if (!step_each_bucket_) {
    std::vector<torch::Tensor> trained;
    for (const auto& group : optimizer_->param_groups())
      for (const auto& p : group.params())
        if (p.requires_grad()) trained.push_back(p);
    step_each_bucket_ = dynamic_cast<FusedOptimizer*>(optimizer_.get()) != nullptr && !scaler_.is_enabled() &&
                        config_.grad_clip_norm <= 0 && sync_->can_step_each_bucket(trained);
  }
  return *step_each_bucket_;
}

void Trainer::enter(Phase phase) {
  phase_ = phase;
  memory_.begin(phase);
}

// ---- The training step --------------------------------------------------------------------
StepResult Trainer::step(int64_t group_size, const std::function<Batch(int64_t)>& micro_batch) {
  StepResult result;
  torch::Tensor loss_sum;
  for (int64_t i = 0; i < group_size; ++i) {
    const bool last = i + 1 == group_size;
    Batch batch = micro_batch(i);
    result.samples += batch.size();
    if (sync_) sync_->before_forward();

    // 1. Forward pass under autocast: matmuls and convolutions run in fp16/bf16, reductions and
    //    the loss in fp32 (a no-op guard for fp32/tf32).
    enter(Phase::forward);
    torch::Tensor loss;
    {
      AutocastGuard autocast(device_, config_.precision, autocast_cache_);
      loss = loss_fn_(batch);
    }

    // 2. Backward pass of the scaled loss. Dividing by the group size makes the accumulated
    //    gradient the mean over all micro-batches, as one big batch would give.
    enter(Phase::backward);
    if (sync_) sync_->before_backward(loss, /*reduce_after_this=*/last);
    scaler_.scale(loss / static_cast<double>(group_size)).backward();
    loss_sum = loss_sum.defined() ? loss_sum + loss.detach() : loss.detach().clone();
  }

  // 3. Optimizer step: wait for the gradient all-reduce (DDP), unscale (fp16), clip, step unless
  //    an inf/NaN was found, adjust the loss scale, clear the gradients.
  enter(Phase::optimizer);
  if (sync_ && steps_each_bucket()) {
    // DDP with a fused optimizer, no loss scaling and no clipping (nothing needs all gradients
    // first): each bucket's parameters are updated as soon as its all-reduce is done, while the
    // later buckets are still on the wire. The same update as one step over all parameters.
    auto& fused = dynamic_cast<FusedOptimizer&>(*optimizer_);
    sync_->finish_stepping_each_bucket([&](const std::vector<torch::Tensor>& params) { fused.step_parameters(params); });
  } else {
    if (sync_) sync_->finish();
    scaler_.unscale_(*optimizer_);
    if (config_.grad_clip_norm > 0) result.grad_norm = clip_grad_norm_(parameters_, config_.grad_clip_norm);
    scaler_.step(*optimizer_);
    if (scaler_.is_enabled()) result.skipped = scaler_.found_inf().clamp_max(1.0);
    scaler_.update();
  }
  optimizer_->zero_grad(/*set_to_none=*/true);  // backward then writes fresh gradients instead of adding to zeros

  memory_.end_step(global_step_);
  phase_ = Phase::other;
  ++global_step_;
  result.loss = loss_sum / static_cast<double>(group_size);
  return result;
}

}  // namespace amplab
