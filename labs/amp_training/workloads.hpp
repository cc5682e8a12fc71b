// The lab's two workloads, given (no TODOs): the wide MLP and the small CNN the precisions are
// timed on, each with one fixed batch on the device and its loss (labs/amp_training/README.md),
// and how one precision is timed on one of them through the core's Trainer and your train_step.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "amplab/data/batches.hpp"
#include "amplab/measure/timing.hpp"
#include "amplab/train/precision.hpp"
#include "amplab/train/trainer.hpp"
#include "config.hpp"

namespace amp_training {

// A model, its data and its loss, on the device; `initial` keeps the starting parameters on the
// host so that every precision starts from the same weights.
struct Workload {
  std::string name, shape;  // shape: for the header lines
  std::shared_ptr<torch::nn::Module> model;
  std::vector<torch::Tensor> initial;
  amplab::Batch batch;  // one fixed, device-resident batch: the data path is not what is measured
  amplab::LossFn loss_fn;
  double flops_per_step = 0;  // 0: not counted
  void reset();               // the parameters back to `initial`
};

// "mlp" (amp.mlp) or "cnn" (amp.cnn), made after torch::manual_seed(seed).
Workload make_workload(const std::string& name, const AmpLabConfig& amp, torch::Device device, uint64_t seed);

// One row of the comparison: a model trained in one precision.
struct PrecisionResult {
  std::string model;
  amplab::Precision precision = amplab::Precision::fp32;
  bool loss_scaling = false;    // the GradScaler was enabled
  std::string skipped_because;  // "" when it ran
  amplab::Summary step_ms;      // ms per step: one sample per timed window (window time / steps)
  double peak_mib = 0;          // from warm-up to the end (GPU: allocated by tensors; CPU: process RSS)
  double final_loss = NAN, samples_per_s = 0, tflops = 0;  // tflops 0: the FLOPs are not counted
  bool ran() const { return skipped_because.empty(); }
  std::string label() const {  // "bf16-mixed", "fp16-mixed (no scaler)"
    const bool usual = loss_scaling == amplab::needs_loss_scaling(precision);
    return amplab::to_string(precision) + (usual ? "" : loss_scaling ? " (scaler)" : " (no scaler)");
  }
};


// `warmup` untimed steps, then `repeats` windows of `window` steps queued back to back as a
// training loop runs them (no host sync inside a window), each window timed as a whole.
// The Trainer steps with your train_step and train.fast_path as configured: `fused_optimizer` is
// the fast path's (the app hands it in).
PrecisionResult run_precision(Workload& w, amplab::Precision precision, bool with_scaler, const AmpConfig& config,
                              torch::Device device, const amplab::OptimizerFactory& fused_optimizer);

}  // namespace amp_training
