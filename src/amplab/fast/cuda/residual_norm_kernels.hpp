// CUDA kernels for a transformer's residual step, each pass one kernel:
//   sum    = x + dropout(branch, p)              the residual stream, float32
//   normed = layer_norm(sum) * weight            the next layer's input, no bias, eps as given
// where PyTorch runs a dropout, an add, a LayerNorm and autocast's cast to the matmul's dtype
// (forward), and their backward kernels with a separate sum for the weight's gradient. The
// dropout's mask is never stored: the backward draws it again from the same Philox counter.
//
// One warp per row. Values follow PyTorch's ops: the kept branch times 1 / (1 - p) rounded to the
// branch's dtype before the add, mean and biased variance in float (over the row in another order
// than PyTorch's), normed rounded once to its dtype. The weight's gradient is a float sum in a
// fixed order (deterministic). The mask is the fast path's own draw from the CUDA generator's
// Philox stream (4 numbers per 4 elements, as PyTorch's kernels reserve them), not the one
// torch::dropout would draw: the same seed gives the same run, not the textbook path's mask.
//
// Layouts: x (rows, C) float32 contiguous, or undefined (no residual yet: sum = dropout(branch));
// branch (rows, C) float32, bfloat16 or float16,
// contiguous; weight (C) float32; normed in the branch's dtype. C a multiple of 128, at most 1024
// (dropout_add_layer_norm_supported says whether a call can take its tensors).
#pragma once

#include <ATen/core/Tensor.h>

namespace amplab::cuda {

bool dropout_add_layer_norm_supported(const at::Tensor& x, const at::Tensor& branch, const at::Tensor& weight);

struct ResidualNormSaved {
  at::Tensor sum, normed;  // the outputs
  at::Tensor mean, rstd;   // (rows) float32, per row
  at::Tensor philox;       // (2) int64 on the device: the seed and offset the mask was drawn with
};
ResidualNormSaved dropout_add_layer_norm_forward(const at::Tensor& x, const at::Tensor& branch, const at::Tensor& weight,
                                                 double p, double eps);

struct ResidualNormGrads {
  at::Tensor x, branch, weight;
};
// grad_sum may be undefined (the sum was not used again: the last LayerNorm's input). Without
// x_needs_grad, grads.x stays undefined and is never written.
ResidualNormGrads dropout_add_layer_norm_backward(const at::Tensor& grad_sum, const at::Tensor& grad_normed,
                                                  const ResidualNormSaved& saved, const at::Tensor& weight, double p,
                                                  bool x_needs_grad = true);

}  // namespace amplab::cuda
