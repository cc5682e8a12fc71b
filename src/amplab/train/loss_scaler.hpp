// The loss-scaler contract: what the core (the training loop, checkpoints, CUDA graphs) needs
// from a GradScaler. The GradScaler itself is lab 2's (labs/amp_training/grad_scaler.hpp): the
// students write it, and the trainer gets it from the factory it is handed (trainer.hpp).
//
// The method names and meanings are those of torch.amp.GradScaler: scale the loss before
// backward, unscale_ the gradients (recording whether any is inf/NaN), step (skipping it after an
// overflow), update the scale. Disabled, every call is a pass-through, so fp32 and bf16 runs use
// the same code path as fp16.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <limits>

#include "amplab/infra/config.hpp"

namespace amplab {

struct GradScalerConfig {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;  // false: scale/unscale/update do nothing, step just steps

  template <class V>
  void fields(V& v) {
    v.field("init_scale", init_scale, "first loss scale", Range<double>::positive());
    v.field("growth_factor", growth_factor, "scale multiplier after growth_interval clean steps",
            Range<double>{1.0, std::numeric_limits<double>::max(), true});
    v.field("backoff_factor", backoff_factor, "scale multiplier after an overflow (inf/NaN gradients)",
            Range<double>{0.0, 1.0, true});
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

class LossScaler {
 public:
  virtual ~LossScaler() = default;

  virtual torch::Tensor scale(const torch::Tensor& loss) = 0;  // loss * scale
  virtual void unscale_(torch::optim::Optimizer& optimizer) = 0;
  // Steps unless a gradient was inf/NaN; returns whether it stepped (or queued the step).
  virtual bool step(torch::optim::Optimizer& optimizer) = 0;
  virtual void update() = 0;

  virtual bool is_enabled() const = 0;
  virtual double get_scale() const = 0;       // a host sync; 1.0 when disabled
  virtual int64_t growth_tracker() const = 0;  // a host sync; 0 when disabled
  // 0-dim float32: non-zero when the last step() found inf/NaN gradients (undefined before).
  virtual torch::Tensor found_inf() const = 0;

  virtual GradScalerState state() const = 0;  // an error when disabled
  virtual void load_state(const GradScalerState& state) = 0;

  // Whether step() on `optimizer` decides the skip on the device, with no host sync: what a CUDA
  // graph of the whole step needs (cuda_graph.hpp). A scaler that reads found_inf on the host
  // says no, and the loop then runs eagerly.
  virtual bool skips_on_device(const torch::optim::Optimizer& optimizer) const { return false; }
};

}  // namespace amplab
