// The whole training step as one CUDA graph. Small models are launch-bound: an eager step costs
// dozens of kernel launches from the host; replaying a captured graph launches them all at once.
// Trainer::step is captured as it is, so the conditions are those of capturing it:
//   - the batch lives in static device tensors (this class copies each batch into them);
//   - no host synchronisation inside the step: loss scaling off (fp32/bf16), or a fused optimizer
//     that skips on the device with a GradScaler that lets it (LossScaler::skips_on_device);
//   - one micro-batch per step (accumulation_steps 1) of a fixed size (a batch of another size,
//     like a ragged last one, runs eagerly);
//   - optimizer state exists before the capture (the warm-up steps create it).
#pragma once

#include <memory>

#include "amplab/data/batches.hpp"
#include "amplab/train/trainer.hpp"

namespace amplab {

class GraphedTrainStep {
 public:
  // Throws amplab::Error when `trainer` cannot be captured (CPU device, host syncs, accumulation).
  GraphedTrainStep(Trainer& trainer, int warmup_steps = 3);
  ~GraphedTrainStep();
  // The first warmup_steps calls run eagerly (on a side stream, as capture requires); the next
  // one captures; later ones copy `batch` into the static inputs and replay. The returned
  // tensors are copies, safe to keep across steps.
  StepResult step(const Batch& batch);
  // The same, gathering batch `index` of `data` straight into the static inputs.
  StepResult step(BatchSource& data, int64_t index);
  bool captured() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Why `trainer` cannot run as a CUDA graph, or "" when it can.
std::string cuda_graph_blocker(Trainer& trainer);
// The blocker of a GradScaler that reads found_inf on the host: the loop then runs eagerly
// (slower, still right) instead of refusing, since that is how lab 2's scaler starts out.
inline constexpr const char* kScalerOnTheHost =
    "the GradScaler decides the skip on the host (lab 2's stretch TODO makes it decide on the device)";

}  // namespace amplab
