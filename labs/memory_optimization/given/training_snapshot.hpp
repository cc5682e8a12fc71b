// Trying training steps without keeping what they did: a host copy of a model's parameters,
// buffers and gradients, its optimizer's state and the random generators, put back on demand.
// What lab 3's batch-size finder runs each trial from: code the lab gives.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <memory>
#include <utility>
#include <vector>


namespace memory_optimization {

// Host copies of everything a few training steps change: the parameters, buffers and gradients of
// a model, the state of its optimizer (momentum, Adam moments and step counts, learning rates) and
// torch's CPU and CUDA random generators. Host copies, so that the snapshot does not take GPU memory
// that the steps it protects would otherwise have.
class TrainingSnapshot {
 public:
  TrainingSnapshot(torch::nn::Module& model, torch::optim::Optimizer* optimizer);
  // Puts everything back: values copied into the same tensors (the optimizer's state stays keyed
  // to them), gradients as they were (undefined ones undefined again), optimizer state replaced
  // (state created since the snapshot is dropped), generators reset.
  void restore();

 private:
  torch::nn::Module& model_;
  torch::optim::Optimizer* optimizer_;
  std::vector<torch::Tensor> parameters_;  // host copies, in model.parameters() order
  std::vector<torch::Tensor> grads_;       // host copies; undefined where the gradient was
  std::vector<torch::Tensor> buffers_;     // host copies, in model.buffers() order
  // The optimizer's per-parameter state as host copies, by position among its parameters (SGD,
  // Adam, AdamW), and its param groups' options; other optimizers go through their own
  // serialization (slower: an archive per restore).
  std::vector<std::pair<size_t, std::unique_ptr<torch::optim::OptimizerParamState>>> optimizer_states_;
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> group_options_;
  bool serialized_ = false;
  std::string optimizer_archive_;
  torch::Tensor cpu_rng_;
  std::vector<std::pair<c10::DeviceIndex, torch::Tensor>> cuda_rng_;
};

}  // namespace memory_optimization
