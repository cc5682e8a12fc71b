// Where a training step's time goes: the step taken apart into its phases (getting the batch,
// forward, backward, the optimizer: the labs' own mechanisms, called one phase at a time), each
// phase run alone between two synchronizations, `steps` times (medians). host ms: the CPU issuing
// the phase (launching its kernels on a GPU; doing all of it on the CPU). device ms: from the
// phase's start to the end of its last kernel (CUDA events; on the CPU the same as host). A GPU
// phase whose device time is hardly more than its host time is launch-bound: the GPU waited for
// the CPU to hand it work. Then the whole step, eager and back to back (host launches overlap the
// GPU's work), against the sum of the phases. Its steps train the model: take it after the results.
#pragma once

#include <string>
#include <vector>

#include "amplab/data/batches.hpp"
#include "amplab/train/trainer.hpp"

namespace mnist {

struct PhaseTiming {
  std::string phase;  // data, forward, backward, optimizer, "sum of the phases", "eager step, back to back"
  double host_ms = 0;
  double device_ms = 0;
};

// `steps` timed steps after 3 untimed ones, phase by phase, then back to back.
std::vector<PhaseTiming> profile_step(amplab::Trainer& trainer, amplab::BatchSource& batches, int steps);

}  // namespace mnist
