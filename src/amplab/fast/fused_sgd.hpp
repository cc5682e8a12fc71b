// SGD through PyTorch's fused kernel (torch.optim.SGD(fused=True)): one kernel updates every
// parameter, and with a GradScaler it unscales and skips on the device (grad_scale and
// found_inf inputs), so an fp16 step needs no host synchronisation and can be captured in a
// CUDA graph. State and checkpoints are those of torch::optim::SGD.
#pragma once

#include <torch/optim/sgd.h>

#include "amplab/fast/fused_optimizer_of.hpp"

namespace amplab {

class FusedSGD : public FusedOptimizerOf<torch::optim::SGD> {
 public:
  FusedSGD(const std::vector<torch::Tensor>& params, torch::optim::SGDOptions options);

 private:
  void fused_step(const std::optional<torch::Tensor>& grad_scale, const std::optional<torch::Tensor>& found_inf,
                  const ParameterSubset* only) override;
};

}  // namespace amplab
