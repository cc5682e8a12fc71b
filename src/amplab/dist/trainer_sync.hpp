// The loop's side of data-parallel training: metrics averaged across ranks, one writer, and a
// stop that every rank agrees on. (The gradient synchronization plugs into the trainer through
// amplab::GradientSync, trainer.hpp; the labs write it: labs/ddp.)
#pragma once

#include <memory>
#include <string>

#include "amplab/dist/communicator.hpp"
#include "amplab/train/loop.hpp"

namespace amplab::dist {

// Loop hooks: rank 0 writes; losses are averaged across ranks; a stop request (Ctrl-C on any
// rank) is agreed at log points so that every rank stops after the same step.
DistributedHooks loop_hooks(std::shared_ptr<Communicator> comm);

}  // namespace amplab::dist
