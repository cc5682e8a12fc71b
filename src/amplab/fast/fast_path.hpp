// train.fast_path, composed. The key turns on together what this room holds: the fused network
// (FusedMnistNet: our kernels for the convolutions), a transformer's residual step in one
// kernel (fused_residual_norm.hpp, which lab 7's program builds its FusedGpt from), an FP8 ReLU
// MLP whose casts are one kernel each (fused_fp8_mlp.hpp, a row of lab 7's FP8 table), PyTorch's
// fused SGD/AdamW, and on a GPU the whole step replayed as one CUDA graph. The teaching core (models/, train/) never includes
// this room; a lab's program that offers the key does, and hands the core what these functions
// make: the network, the Trainer's optimizer factory, and fit()'s way of running a step.
#pragma once

#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "amplab/data/batches.hpp"
#include "amplab/models/models.hpp"
#include "amplab/train/trainer.hpp"

namespace amplab {

// The Trainer's OptimizerFactory: with train.fast_path PyTorch's fused SGD or AdamW (FusedSGD,
// FusedAdamW; other optimizers are refused in one line naming both keys), without it
// make_optimizer's torch::optim ones.
std::unique_ptr<torch::optim::Optimizer> make_fast_path_optimizer(const std::vector<torch::Tensor>& parameters,
                                                                  const TrainConfig& config);

// Refuses, in one line naming both keys, an optimizer train.fast_path has no fused kernel for
// (sgd and adamw have one). make_fast_path_optimizer checks it; a program may before its first run.
void check_fast_path(bool fast_path, const OptimizerConfig& optimizer);

// The MNIST network train.fast_path asks for: the fused one, or the textbook MnistNet. Both have
// the same parameters under the same names.
MnistNet make_mnist_net(const TrainConfig& config);

// "fast path on (train.fast_path): fused adamw" or "fast path off: torch::optim adamw": what the
// key chose for the optimizer, for labs without a network or a loop of the fast path.
std::string describe_fast_path(bool fast_path, const OptimizerConfig& optimizer);

// How fit() runs the steps of `trainer` (FitOptions::run_step), and the line a run's log starts
// with, saying which path runs.
struct FastPathSteps {
  // Empty: Trainer::step eagerly. Else a step of batch first_batch replayed as one CUDA graph
  // (GraphedTrainStep; `batches` is 1, since a graph captures one micro-batch per step).
  std::function<StepResult(BatchSource& data, int64_t first_batch, int64_t batches)> run_step;
  // e.g. "fast path on (train.fast_path): FusedMnistNet (our kernels), fused adamw, one CUDA graph per step"
  std::string description;
};
// With train.fast_path on a GPU, the step as one CUDA graph, in one process. Eager without the
// fast path, on the CPU, when `processes` > 1 (each bucket's all-reduce is started from the
// host, by the gradient sync's hooks during backward) and, with a warning, when the GradScaler
// decides the skip on the host (how lab 2's scaler starts out). Throws naming train.fast_path
// when the step cannot be captured otherwise (accumulation_steps > 1).
FastPathSteps fast_path_steps(Trainer& trainer, int64_t processes = 1);

}  // namespace amplab
