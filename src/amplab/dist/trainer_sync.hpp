// The loop's side of data-parallel training: metrics averaged across ranks, one writer, and a
// stop that every rank agrees on. (The gradient synchronization plugs into the trainer through
// amplab::GradientSync, trainer.hpp; the labs write it: labs/ddp.)
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <string>

#include "amplab/dist/communicator.hpp"
#include "amplab/train/loop.hpp"

namespace amplab::dist {

// Loop hooks: rank 0 writes; losses are averaged across ranks; a stop request (Ctrl-C on any
// rank) is agreed at log points so that every rank stops after the same step.
DistributedHooks loop_hooks(std::shared_ptr<Communicator> comm);

// Whether every rank holds bit-identical parameters after data-parallel training, by the CRC-32 of
// each rank's parameter bytes (`fingerprint`: this rank's). A collective: every rank calls it.
struct ParameterCheck {
  bool identical = false;
  std::string fingerprint;
};
ParameterCheck check_parameters_identical(Communicator& comm, torch::nn::Module& model);

}  // namespace amplab::dist
