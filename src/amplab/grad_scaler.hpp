// torch.amp.GradScaler in C++, with PyTorch's semantics and state (torch/amp/grad_scaler.py).
//
// fp16 gradients underflow to zero below ~6e-8. Multiplying the loss by a large scale S before
// backward shifts the gradients into fp16's range; dividing them by S before the optimizer step
// restores their values. If any gradient overflowed (inf/NaN), the step is skipped and S halves;
// after growth_interval clean steps S doubles. Disabled, every call is a pass-through, so fp32
// and bf16 runs use the same code path as fp16.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>

#include "amplab/config.hpp"
#include "amplab/fused_optimizer.hpp"

namespace amplab {

struct GradScalerConfig {
  double init_scale = 65536.0;     // 2^16, the first loss scale
  double growth_factor = 2.0;      // scale *= this after growth_interval clean steps (> 1)
  double backoff_factor = 0.5;     // scale *= this after a step with inf/NaN gradients (< 1)
  int64_t growth_interval = 2000;  // clean steps between growths
  bool enabled = true;             // false: scale/unscale/update do nothing, step just steps

  template <class V>
  void fields(V& v) {
    v.field("init_scale", init_scale, "first loss scale", Range<double>::positive());
    v.field("growth_factor", growth_factor, "scale multiplier after growth_interval clean steps",
            Range<double>{1.0, std::numeric_limits<double>::max(), true});
    v.field("backoff_factor", backoff_factor, "scale multiplier after an overflow", Range<double>{0.0, 1.0, true});
    v.field("growth_interval", growth_interval, "clean steps between growths", Range<int64_t>::at_least(1));
  }
};

// What a checkpoint keeps (PyTorch's state_dict keys: scale, growth_factor, backoff_factor,
// growth_interval, _growth_tracker).
struct GradScalerState {
  double scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  int64_t growth_tracker = 0;  // clean steps since the last growth or backoff
};

class GradScaler {
 public:
  // Throws amplab::Error unless growth_factor > 1 and backoff_factor < 1 (when enabled).
  explicit GradScaler(const GradScalerConfig& config = {});

  // loss * scale. The scale tensor is created on the loss's device the first time.
  torch::Tensor scale(const torch::Tensor& loss);

  // Divides the optimizer's gradients by the scale in place (reciprocal computed in fp64, as
  // PyTorch does) and records whether any was inf/NaN. No host synchronisation. At most once
  // per optimizer between updates; an error after step(); an error on fp16 gradients (keep
  // the parameters fp32 and let autocast cast them).
  void unscale_(torch::optim::Optimizer& optimizer);

  // Unscales if unscale_ was not called, then runs optimizer.step() unless an inf/NaN was found.
  // Returns whether the optimizer stepped (reading found_inf synchronises with the device, which
  // the decision needs). Disabled: always steps and returns true.
  // A FusedOptimizer (fused_optimizer.hpp) gets the scale and the inf flag instead and decides on
  // the device, as PyTorch does for fused optimizers: no host sync, and step() returns true
  // after queuing it; found_inf() tells what happened.
  bool step(torch::optim::Optimizer& optimizer);
  // 0-dim float32 on the scale's device: non-zero when the last step() found inf/NaN gradients.
  const torch::Tensor& found_inf() const { return last_found_inf_; }

  // Adjusts the scale from this iteration's found_inf: backoff and tracker reset on overflow,
  // growth after growth_interval clean steps (never past the largest finite fp32 value). Resets
  // the per-optimizer stages. The second form sets the scale explicitly.
  void update();
  void update(double new_scale);

  // The current scale (a host sync); init_scale before the first scale(), 1.0 when disabled.
  double get_scale() const;
  int64_t growth_tracker() const;
  bool is_enabled() const { return enabled_; }
  const torch::Tensor& scale_tensor() const { return scale_; }  // undefined before the first scale()

  // Combines found_inf across processes (distributed runs: every rank must skip together).
  // Called by unscale_ with the found_inf tensor of each device; the function reduces in place.
  void set_found_inf_reducer(std::function<void(torch::Tensor&)> reducer) { reduce_found_inf_ = std::move(reducer); }

  GradScalerState state() const;  // an error when disabled, like loading an empty state_dict
  void load_state(const GradScalerState& state);

 private:
  enum class Stage { ready, unscaled, stepped };
  struct OptimizerState {
    Stage stage = Stage::ready;
    std::map<std::string, torch::Tensor> found_inf_per_device;  // device string -> float32 0-dim
  };
  void check_initialized(const char* what) const;
  void record_found_inf(torch::optim::Optimizer& optimizer, const torch::Tensor& inv_scale, bool allow_fp16,
                        bool check_only);

  bool enabled_;
  double init_scale_, growth_factor_, backoff_factor_;
  int64_t growth_interval_;
  int64_t init_growth_tracker_ = 0;
  torch::Tensor scale_;           // float32 0-dim, on the loss's device
  torch::Tensor growth_tracker_;  // int32 0-dim, same device
  std::map<const torch::optim::Optimizer*, OptimizerState> per_optimizer_;
  std::function<void(torch::Tensor&)> reduce_found_inf_;
  torch::Tensor last_found_inf_;
};

}  // namespace amplab
