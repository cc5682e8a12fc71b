#include "amplab/train/trainer.hpp"

#include <algorithm>

#include <torch/torch.h>

#include "amplab/infra/device.hpp"
#include "amplab/infra/error.hpp"
#include "amplab/train/fused_optimizer.hpp"
#include "amplab/train/step.hpp"  // lab 2's step and lab 3's accumulation, linked in

namespace amplab {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<torch::Tensor>& parameters,
                                                        const OptimizerConfig& c) {
  if (c.name == "sgd") return std::make_unique<torch::optim::SGD>(parameters, sgd_options(c));
  if (c.name == "adam")
    return std::make_unique<torch::optim::Adam>(
        parameters, torch::optim::AdamOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(c.weight_decay));
  if (c.name == "adamw") return std::make_unique<torch::optim::AdamW>(parameters, adamw_options(c));
  throw Error("train.optimizer.name: '" + c.name + "' is not allowed; use one of: sgd, adam, adamw");
}

torch::optim::SGDOptions sgd_options(const OptimizerConfig& c) {
  return torch::optim::SGDOptions(c.lr).momentum(c.momentum).weight_decay(c.weight_decay);
}

torch::optim::AdamWOptions adamw_options(const OptimizerConfig& c) {
  return torch::optim::AdamWOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(c.weight_decay);
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

Trainer::Trainer(std::shared_ptr<torch::nn::Module> model, LossFn loss_fn, const TrainConfig& config,
                 torch::Device device, const MemoryConfig& memory, const OptimizerFactory& optimizer_factory)
    : model_(std::move(model)),
      loss_fn_(std::move(loss_fn)),
      config_(config),
      device_(device),
      memory_(device, memory),
      tf32_(config.precision == Precision::tf32) {
  check_supported(config_.precision, device_);
  check_on_device(*model_, device_);
  parameters_ = model_->parameters();
  if (optimizer_factory) {
    optimizer_ = optimizer_factory(parameters_, config_);
  } else {
    if (config_.fast_path)
      throw Error("train.fast_path: this program gave the trainer no optimizer of the fast path "
                  "(make_fast_path_optimizer, amplab/fast/fast_path.hpp); set train.fast_path=false");
    optimizer_ = make_optimizer(parameters_, config_.optimizer);
  }
  if (!optimizer_) throw Error("Trainer: the optimizer factory returned nothing");
  scaler_ = amp_training::make_loss_scaler(config_);  // lab 2
  if (!scaler_) throw Error("Trainer: the loss-scaler factory returned nothing");
}

bool Trainer::steps_each_bucket() {
  if (!step_each_bucket_) {
    std::vector<torch::Tensor> trained;
    for (const auto& group : optimizer_->param_groups())
      for (const auto& p : group.params())
        if (p.requires_grad()) trained.push_back(p);
    step_each_bucket_ = dynamic_cast<FusedOptimizer*>(optimizer_.get()) != nullptr && !scaler_->is_enabled() &&
                        config_.grad_clip_norm <= 0 && sync_->can_step_each_bucket(trained);
  }
  return *step_each_bucket_;
}

void Trainer::enter(Phase phase) {
  phase_ = phase;
  memory_.begin(phase);
}

torch::Tensor Trainer::forward_loss(const Batch& batch, bool last_micro_batch) {
  if (sync_) sync_->before_forward();
  enter(Phase::forward);
  torch::Tensor loss = loss_fn_(batch);
  enter(Phase::backward);
  if (sync_) sync_->before_backward(loss, /*reduce_after_this=*/last_micro_batch);
  return loss;
}

void Trainer::gradients_ready() {
  enter(Phase::optimizer);
  if (sync_) sync_->finish();
}

StepResult Trainer::step(const Batch& batch) {
  if (sync_ && steps_each_bucket())  // DDP updating each bucket as it is reduced: below
    return step(MicroBatches{1, [&](int64_t) { return batch.size(); }, [&](int64_t) { return batch; }});
  // Lab 2's train_step (labs/amp_training/amp_training.hpp): forward under autocast, scaled
  // backward, unscale, clip, then the optimizer's step, or a skipped one, and the scale's update.
  StepResult result = amp_training::train_step(*this, batch);
  result.samples = batch.size();
  return finish_step(result);
}

StepResult Trainer::step(const MicroBatches& group) {
  if (group.count == 1 && !(sync_ && steps_each_bucket())) return step(group.batch(0));
  StepResult result;
  result.loss = memory_optimization::accumulate_gradients(*this, group);  // lab 3
  for (int64_t i = 0; i < group.count; ++i) result.samples += group.rows(i);
  if (sync_ && steps_each_bucket()) {
    // DDP with a fused optimizer, no loss scaling and no clipping (nothing needs all gradients
    // first): each bucket's parameters are updated as soon as its all-reduce is done, while the
    // later buckets are still on the wire. The same update as one step over all parameters: the
    // reference's fast path, which needs no mechanism of lab 2.
    enter(Phase::optimizer);
    auto& fused = dynamic_cast<FusedOptimizer&>(*optimizer_);
    sync_->finish_stepping_each_bucket([&](const std::vector<torch::Tensor>& params) { fused.step_parameters(params); });
    return finish_step(result);
  }
  StepResult stepped = amp_training::optimizer_step(*this);  // lab 2
  result.grad_norm = stepped.grad_norm;
  result.skipped = stepped.skipped;
  return finish_step(result);
}

StepResult Trainer::finish_step(StepResult result) {
  optimizer_->zero_grad(/*set_to_none=*/true);  // backward then writes fresh gradients instead of adding to zeros
  memory_.end_step(global_step_);
  phase_ = Phase::other;
  ++global_step_;
  return result;
}

}  // namespace amplab
