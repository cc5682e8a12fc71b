// StepSettings (train:): the part of TrainConfig a lab sets when it picks precision and loss scaling per row itself.
//
// A lab whose rows each run a Trainer with their own precision and loss scaling reads only these
// keys from its config's train: section, and makes each row's TrainConfig with for_row(): the one
// place the settings reach a row, so that a key added here reaches every row. A lab with another
// default clip gives it where it declares the section:
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
  // A row's trainer config: these settings, with the row's precision and loss scaling.
  TrainConfig for_row(Precision precision, const std::string& loss_scaling) const {
    TrainConfig row;
    row.precision = precision;
    row.loss_scaling = loss_scaling;
    row.grad_clip_norm = grad_clip_norm;
    row.fast_path = fast_path;
    row.optimizer = optimizer;
    row.grad_scaler = grad_scaler;
    return row;
  }

  template <class V>
  void fields(V& v) {
    v.field("grad_clip_norm", grad_clip_norm, "clip the gradient 2-norm to this (0: off)", Range<double>::at_least(0));
    v.field("fast_path", fast_path, kFastPathDescription);
    v.section("optimizer", optimizer);
    v.section("grad_scaler", grad_scaler);
  }
};

}  // namespace amplab
