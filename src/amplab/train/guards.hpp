// What stops a run, as small named checks: a batch size the data cannot fill, divergence (non-finite
// losses, an fp16 loss scale that collapsed), running out of memory, and interrupts agreed by all ranks.
#pragma once

#include <c10/util/Exception.h>

#include <string>
#include <vector>

#include "amplab/data/batches.hpp"
#include "amplab/train/loop.hpp"

namespace amplab {

// Throws, in one line, when train.batch_size leaves no batch or exceeds the training set.
void check_batches_fit(const TrainConfig& config, BatchSource& data, int64_t world_size);

// Remembers consecutive non-finite losses across log windows.
struct DivergenceGuard {
  int patience;
  int consecutive = 0;
  // Why the run must stop after these losses ("" to go on).
  std::string check(const std::vector<double>& losses, bool scaling, double scale, double min_scale);
};

// Why an epoch whose every loss was NaN or inf diverged, whatever the patience.
std::string no_finite_loss_message(int64_t steps, int64_t epoch, int patience);

// Out of memory during a step: what to tell, and whether the parameters are intact (the step had
// not started updating them). Clears the gradients.
struct OutOfMemory {
  std::string message;
  bool parameters_intact = false;
};
OutOfMemory out_of_memory(const c10::OutOfMemoryError& error, Trainer& trainer);

// Ctrl-C/SIGTERM seen on any rank (one tiny all-reduce when distributed), and the exit code.
struct Interrupt {
  bool stop = false;
  int exit_code = 0;
};
Interrupt agreed_interrupt(const DistributedHooks& dist);

}  // namespace amplab
