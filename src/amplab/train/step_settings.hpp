// StepSettings (train:): the part of TrainConfig a lab sets when it picks precision and loss scaling per row itself.
//
// A lab whose rows each run a Trainer with their own precision and loss scaling reads only these
// keys from its config's train: section, and copies them into each row's TrainConfig. A lab with
// another default clip gives it where it declares the section:
//   amplab::StepSettings train{/*grad_clip_norm=*/1.0};
#pragma once

#include "amplab/infra/config.hpp"
#include "amplab/train/loss_scaler.hpp"
#include "amplab/train/trainer.hpp"

namespace amplab {

// What the step needs from the trainer config (precision and loss scaling are set per row).
struct StepSettings {
  explicit StepSettings(double default_grad_clip_norm = 0.0) : grad_clip_norm(default_grad_clip_norm) {}
  double grad_clip_norm;
  bool fast_path = false;
  OptimizerConfig optimizer;
  GradScalerConfig grad_scaler;
  template <class V>
  void fields(V& v) {
    v.field("grad_clip_norm", grad_clip_norm, "clip the gradient 2-norm to this (0: off)", Range<double>::at_least(0));
    v.field("fast_path", fast_path, kFastPathDescription);
    v.section("optimizer", optimizer);
    v.section("grad_scaler", grad_scaler);
  }
};

}  // namespace amplab
