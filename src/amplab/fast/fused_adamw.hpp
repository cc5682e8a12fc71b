// AdamW through PyTorch's fused kernel (torch.optim.AdamW(fused=True)): one kernel updates every
// parameter and its two moment estimates. As in PyTorch, each parameter's step count is a
// float32 tensor next to it on the device, advanced by the step itself (and taken back when a
// GradScaler finds an inf), so that a step captured in a CUDA graph counts its replays and
// computes the right bias correction. Same results as PyTorch's fused AdamW, to the bit on the
// CPU (tests/fixtures/fused_adamw_golden.json) and on a GPU, where PyTorch's AdamW arithmetic runs
// over chunks sized to the model (cuda/fused_adamw_launch.hpp: small models fill the GPU).
//
// Checkpoints hold torch::optim::AdamW's state, so they load into either class: save() first
// copies the device step counts into that state, load() drops them to be rebuilt from it.
#pragma once

#include <torch/optim/adamw.h>

#include <unordered_map>

#include "amplab/fast/fused_optimizer_of.hpp"

namespace amplab {

class FusedAdamW : public FusedOptimizerOf<torch::optim::AdamW> {
 public:
  using FusedOptimizerOf<torch::optim::AdamW>::FusedOptimizerOf;

  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  void fused_step(const std::optional<torch::Tensor>& grad_scale, const std::optional<torch::Tensor>& found_inf,
                  const ParameterSubset* only) override;
  // The state of `p`, created as PyTorch does on its first step (zero moments, step 0).
  torch::optim::AdamWParamState& state_of(const torch::Tensor& p, const torch::optim::AdamWOptions& options);
  void copy_steps_to_state() const;

  std::unordered_map<c10::TensorImpl*, torch::Tensor> steps_;  // 0-dim float32 step count per parameter
};

}  // namespace amplab
