// The lab's GPT (gpt.hpp) with each residual step in one kernel of the fast path
// (amplab/fast/fused_residual_norm.hpp): a block's attention output, dropped out and added to the
// residual stream, then normalized by the next LayerNorm, in one pass forward and one backward,
// and so for the MLP's output with the next block's first LayerNorm (the last one with ln_f), and
// for the embeddings' dropout with the first block's LayerNorm.
// The same parameters under the same names and the same initial weights as tf8::Gpt: checkpoints
// go from one to the other. What it computes is the textbook model's function; only the dropout
// masks are drawn otherwise (fused_residual_norm.hpp), and the float sums run in other orders.
#pragma once

#include "gpt.hpp"

namespace transformer_fp8 {

class FusedGptImpl : public GptImpl {
 public:
  using GptImpl::GptImpl;
  // Our kernels on a GPU, whatever the attention and linear layers (they compute each block's
  // branches as the lab's model does); GptImpl::forward on the CPU.
  torch::Tensor forward(const torch::Tensor& idx) override;
};

// Whether FusedGptImpl computes a model of these options with our kernels on `device` (a GPU, a
// width our kernel takes).
bool fused_gpt_applies(const GptOptions& options, torch::Device device);

// The train.fast_path model: a Gpt computed by FusedGptImpl where fused_gpt_applies, else the
// lab's own. It goes wherever a Gpt goes.
Gpt make_gpt(const GptOptions& options, bool fast_path, torch::Device device);

}  // namespace transformer_fp8
