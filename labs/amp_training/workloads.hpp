// The lab's two workloads, given (no TODOs): the wide MLP and the small CNN the precisions are
// timed on, each with one fixed batch on the device and its loss (labs/amp_training/README.md).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "amplab/data/batches.hpp"
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

}  // namespace amp_training
