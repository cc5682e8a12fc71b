// Follows torch/amp/grad_scaler.py (PyTorch 2.11) step by step; the two kernels that do the
// work (_amp_foreach_non_finite_check_and_unscale_ and _amp_update_scale_) are PyTorch's own.
#include "amplab/grad_scaler.hpp"

#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_amp_update_scale.h>
#include <ATen/ops/aminmax.h>
#include <torch/torch.h>

#include "amplab/error.hpp"

namespace amplab {

GradScaler::GradScaler(const GradScalerConfig& config)
    : enabled_(config.enabled),
      init_scale_(config.init_scale),
      growth_factor_(config.growth_factor),
      backoff_factor_(config.backoff_factor),
      growth_interval_(config.growth_interval) {
  if (enabled_) {
    if (!(growth_factor_ > 1.0)) throw Error("GradScaler: the growth factor must be > 1.0");
    if (!(backoff_factor_ < 1.0)) throw Error("GradScaler: the backoff factor must be < 1.0");
  }
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) {
  if (!enabled_) return loss;
  if (!scale_.defined()) {  // lazily, on the device of the first loss
    scale_ = torch::full({}, init_scale_, torch::dtype(torch::kFloat32).device(loss.device()));
    growth_tracker_ = torch::full({}, init_growth_tracker_, torch::dtype(torch::kInt32).device(loss.device()));
  }
  return loss * scale_.to(loss.device(), /*non_blocking=*/true);
}

void GradScaler::check_initialized(const char* what) const {
  if (!scale_.defined())
    throw Error(std::string("GradScaler: attempted ") + what +
                " but the scale is not initialized yet; this may be the first iteration: call scale(loss) first");
}

namespace {

// Gradients at least this large (elements) are checked by a reduction of their own; smaller ones
// share one fused launch, cheaper than a reduction per tensor.
constexpr int64_t kLargeGradient = int64_t{1} << 20;

// Sets found_inf to 1 when an element of `grads` is inf or NaN, as PyTorch's check-and-unscale
// kernel does with an inverse scale of 1, but without writing the gradients. That kernel stores
// every element it reads (times 1), doubling the memory traffic of the check: for 1 GiB of fp32
// gradients, ~0.25 ms more per step on an H200, over 1% of a compute-bound fp16 step. Large
// gradients get one read-only aminmax each (NaN propagates to both ends, +-inf shows at one).
void check_non_finite(const std::vector<torch::Tensor>& grads, torch::Tensor& found_inf, const torch::Tensor& one) {
  std::vector<torch::Tensor> small, extremes;
  for (const auto& grad : grads) {
    if (grad.numel() < kLargeGradient) {
      small.push_back(grad);
      continue;
    }
    auto [lowest, highest] = at::aminmax(grad);
    extremes.push_back(lowest);
    extremes.push_back(highest);
  }
  if (!small.empty()) at::_amp_foreach_non_finite_check_and_unscale_(small, found_inf, one);
  if (!extremes.empty()) found_inf.masked_fill_(torch::stack(extremes).isfinite().all().logical_not(), 1.0);
}

}  // namespace

// Checks (and, unless check_only, divides by the scale) every gradient of `optimizer`, recording
// found_inf per device in its state: PyTorch's _unscale_grads_. check_only is PyTorch's call with
// an inverse scale of 1 (the inf check before a fused optimizer step); it leaves the gradients
// untouched, as that call does, and writes nothing.
void GradScaler::record_found_inf(torch::optim::Optimizer& optimizer, const torch::Tensor& inv_scale, bool allow_fp16,
                                  bool check_only) {
  OptimizerState& state = per_optimizer_[&optimizer];
  torch::Tensor found_inf = torch::zeros({}, torch::dtype(torch::kFloat32).device(scale_.device()));
  // Gradients grouped by device, then dtype: one fused kernel call per group.
  std::map<std::string, std::map<c10::ScalarType, std::vector<torch::Tensor>>> groups;
  std::map<std::string, torch::Device> devices;
  torch::NoGradGuard no_grad;
  for (auto& group : optimizer.param_groups()) {
    for (auto& param : group.params()) {
      if (!param.grad().defined()) continue;
      torch::Tensor grad = param.grad();
      if (!allow_fp16 && grad.scalar_type() == torch::kHalf)
        throw Error("GradScaler: attempting to unscale FP16 gradients; keep the parameters in fp32 "
                    "(autocast casts them for the forward pass)");
      torch::Tensor to_unscale = grad.is_sparse() ? grad._values() : grad;
      std::string key = to_unscale.device().str();
      devices.emplace(key, to_unscale.device());
      groups[key][to_unscale.scalar_type()].push_back(to_unscale);
    }
  }
  for (auto& [key, per_dtype] : groups) {
    torch::Device device = devices.at(key);
    torch::Tensor device_found_inf = found_inf.device() == device ? found_inf : found_inf.to(device);
    torch::Tensor device_inv_scale = inv_scale.device() == device ? inv_scale : inv_scale.to(device);
    for (auto& [dtype, grads] : per_dtype) {
      if (check_only)
        check_non_finite(grads, device_found_inf, device_inv_scale);
      else
        at::_amp_foreach_non_finite_check_and_unscale_(grads, device_found_inf, device_inv_scale);
    }
    if (reduce_found_inf_) reduce_found_inf_(device_found_inf);
    state.found_inf_per_device[key] = device_found_inf;
  }
  if (groups.empty()) {  // no gradients at all: the (zero) flag is still recorded
    if (reduce_found_inf_) reduce_found_inf_(found_inf);
    state.found_inf_per_device[found_inf.device().str()] = found_inf;
  }
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!enabled_) return;
  check_initialized("unscale_");
  OptimizerState& state = per_optimizer_[&optimizer];
  if (state.stage == Stage::unscaled)
    throw Error("GradScaler: unscale_() has already been called on this optimizer since the last update()");
  if (state.stage == Stage::stepped) throw Error("GradScaler: unscale_() is being called after step()");
  // FP32 division can be imprecise for certain compile options, so the reciprocal is taken in FP64.
  torch::Tensor inv_scale = scale_.to(torch::kFloat64).reciprocal().to(torch::kFloat32);
  record_found_inf(optimizer, inv_scale, /*allow_fp16=*/false, /*check_only=*/false);
  per_optimizer_[&optimizer].stage = Stage::unscaled;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!enabled_) {
    optimizer.step();
    return true;
  }
  check_initialized("step");
  OptimizerState& state = per_optimizer_[&optimizer];
  if (state.stage == Stage::stepped) throw Error("GradScaler: step() has already been called since the last update()");
  if (auto* fused = dynamic_cast<FusedOptimizer*>(&optimizer)) {
    // PyTorch's path for optimizers that support AMP scaling: check for infs without unscaling
    // (inverse scale 1), then hand the scale and the flag to the optimizer's kernel.
    if (state.stage == Stage::ready)
      record_found_inf(optimizer, torch::ones({}, torch::dtype(torch::kFloat32).device(scale_.device())),
                       /*allow_fp16=*/true, /*check_only=*/true);
    OptimizerState& checked = per_optimizer_[&optimizer];
    torch::Tensor found_inf;
    for (auto& [device, flag] : checked.found_inf_per_device) {
      torch::Tensor here = flag.to(scale_.device(), /*non_blocking=*/true);
      found_inf = found_inf.defined() ? found_inf + here : here;
    }
    std::optional<torch::Tensor> grad_scale;
    if (checked.stage != Stage::unscaled) grad_scale = scale_;
    fused->step_with_amp_scaling(grad_scale, found_inf);
    checked.stage = Stage::stepped;
    last_found_inf_ = found_inf;
    return true;
  }
  if (state.stage == Stage::ready) unscale_(optimizer);
  OptimizerState& after = per_optimizer_[&optimizer];
  if (after.found_inf_per_device.empty()) throw Error("GradScaler: no inf checks were recorded for this optimizer");

  torch::Tensor found_inf;
  for (auto& [device, flag] : after.found_inf_per_device) {
    torch::Tensor here = flag.to(scale_.device());
    found_inf = found_inf.defined() ? found_inf + here : here;
  }
  last_found_inf_ = found_inf;
  bool stepped = false;
  if (found_inf.item<double>() == 0) {  // the host sync the skip decision needs
    optimizer.step();
    stepped = true;
  }
  after.stage = Stage::stepped;
  return stepped;
}

void GradScaler::update() {
  if (!enabled_) return;
  check_initialized("update");
  std::vector<torch::Tensor> found_infs;
  for (auto& [optimizer, state] : per_optimizer_)
    for (auto& [device, found_inf] : state.found_inf_per_device)
      found_infs.push_back(found_inf.to(scale_.device(), /*non_blocking=*/true));
  if (found_infs.empty()) throw Error("GradScaler: no inf checks were recorded prior to update()");
  torch::Tensor found_inf_combined = found_infs[0];
  for (size_t i = 1; i < found_infs.size(); ++i) found_inf_combined = found_inf_combined + found_infs[i];
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf_combined, growth_factor_, backoff_factor_, growth_interval_);
  per_optimizer_.clear();
}

void GradScaler::update(double new_scale) {
  if (!enabled_) return;
  check_initialized("update");
  scale_.fill_(new_scale);
  per_optimizer_.clear();
}

double GradScaler::get_scale() const {
  if (!enabled_) return 1.0;
  return scale_.defined() ? scale_.item<double>() : init_scale_;
}

int64_t GradScaler::growth_tracker() const {
  if (!enabled_) return 0;
  return growth_tracker_.defined() ? growth_tracker_.item<int64_t>() : init_growth_tracker_;
}

GradScalerState GradScaler::state() const {
  GradScalerState s;
  s.scale = get_scale();
  s.growth_factor = growth_factor_;
  s.backoff_factor = backoff_factor_;
  s.growth_interval = growth_interval_;
  s.growth_tracker = growth_tracker();
  return s;
}

void GradScaler::load_state(const GradScalerState& s) {
  if (!enabled_) return;
  init_scale_ = s.scale;
  if (scale_.defined()) scale_.fill_(s.scale);
  growth_factor_ = s.growth_factor;
  backoff_factor_ = s.backoff_factor;
  growth_interval_ = s.growth_interval;
  init_growth_tracker_ = s.growth_tracker;
  if (growth_tracker_.defined()) growth_tracker_.fill_(s.growth_tracker);
}

}  // namespace amplab
