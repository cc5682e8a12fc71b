// A transformer block's residual step as one kernel of ours on a GPU
// (src/amplab/fast/cuda/residual_norm_kernels.hpp), and as PyTorch's ops everywhere else:
//   auto [sum, normed] = dropout_add_layer_norm(x, branch, weight, p)
//   sum    == x + dropout(branch, p)                          the residual stream
//   normed == layer_norm(sum, weight, no bias, eps)           the next layer's input
// With p == 0 nothing is dropped (evaluation). x may be undefined, for the first LayerNorm after the
// embeddings: then sum == dropout(branch) in float32 (there is no residual stream yet). On a GPU, normed comes in the branch's dtype:
// under autocast the dtype the next matrix product would cast a float32 LayerNorm's output to,
// so the cast is part of the same kernel. The dropout's mask is the fast path's own draw from the
// CUDA generator (the same seed gives the same run), not the one torch::dropout would draw.
#pragma once

#include <torch/types.h>

#include <utility>

namespace amplab {

std::pair<torch::Tensor, torch::Tensor> dropout_add_layer_norm(const torch::Tensor& x, const torch::Tensor& branch,
                                                               const torch::Tensor& weight, double p, double eps = 1e-5);

// Whether that call runs our kernel (a GPU; x float32 and contiguous or undefined, the branch
// float32, bfloat16 or float16 of x's shape, contiguous; rows of 128, 256, 384, 512, 768 or 1024) or PyTorch's ops.
bool dropout_add_layer_norm_runs_fused(const torch::Tensor& x, const torch::Tensor& branch, const torch::Tensor& weight);

}  // namespace amplab
