// Gradient-norm clipping with torch.nn.utils.clip_grad_norm_'s numerics (PyTorch 2.11): per-tensor
// norms with _foreach_norm, the norm of their stack, then every gradient multiplied by
// min(1, max_norm / (total + 1e-6)). Unlike LibTorch's clip_grad_norm_, which returns a double
// (a host sync every step), the total norm stays a device tensor.
#pragma once

#include <torch/types.h>

#include <vector>

namespace amplab {

// Returns the total 2-norm of the gradients before clipping (0-dim float32 tensor on their device;
// zero when there are none). Parameters without a gradient are skipped.
torch::Tensor clip_grad_norm_(const std::vector<torch::Tensor>& parameters, double max_norm);
torch::Tensor total_grad_norm(const std::vector<torch::Tensor>& parameters);

}  // namespace amplab
