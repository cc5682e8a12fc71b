// The training step's contract: the functions the trainer calls for one optimizer step, declared
// here and defined by the labs that teach them. Lab 2 (amp_training) writes the loss scaler's
// factory, the step and its optimizer half; lab 3 (memory_optimization) gradient accumulation. The
// core names them and includes nothing of a lab: which definition runs is decided once, when a
// binary is linked (cmake/amplab.cmake's amplab_link_mechanisms): the reference here, the student's
// own code in a hand-out, and when grading lab N, the student's lab N with the reference for the
// rest. The labs' headers (labs/amp_training/amp_training.hpp, labs/memory_optimization/
// memory_optimization.hpp) declare the same functions with the students' side of the contract.
#pragma once

#include <torch/types.h>

#include <memory>

namespace amplab {
class LossScaler;
class Trainer;
struct Batch;
struct MicroBatches;
struct StepResult;
struct TrainConfig;
}  // namespace amplab

namespace amp_training {
// The loss scaler a config asks for (disabled unless fp16-mixed or loss_scaling on).
std::unique_ptr<amplab::LossScaler> make_loss_scaler(const amplab::TrainConfig& config);
// One optimizer step on one batch: forward under autocast, scaled backward, then optimizer_step.
// The trainer zeroes the gradients afterwards.
amplab::StepResult train_step(amplab::Trainer& trainer, const amplab::Batch& batch);
// The optimizer half once the scaled gradients are in .grad: unscale and clip when clipping, step or
// skip, update the scale; fills grad_norm and skipped.
amplab::StepResult optimizer_step(amplab::Trainer& trainer);
}  // namespace amp_training

namespace memory_optimization {
// Forward and scaled backward of several micro-batches, each weighted by its share of the samples,
// accumulating into .grad; their mean loss (0-dim, on the device).
torch::Tensor accumulate_gradients(amplab::Trainer& trainer, const amplab::MicroBatches& group);
}  // namespace memory_optimization
