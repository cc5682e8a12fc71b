// The lab's GPT with its residual steps fused (fused_gpt.hpp).
#include "fused_gpt.hpp"

#include <torch/torch.h>

#include "amplab/fast/fused_residual_norm.hpp"

namespace transformer_fp8 {

bool fused_gpt_applies(const GptOptions& options, torch::Device device) {
  if (!device.is_cuda()) return false;
  const auto floats = torch::TensorOptions().device(device);
  const torch::Tensor row = torch::empty({1, options.n_embd}, floats), weight = torch::empty({options.n_embd}, floats);
  return amplab::dropout_add_layer_norm_runs_fused(row, row, weight);
}

torch::Tensor FusedGptImpl::forward(const torch::Tensor& idx) {
  // off a GPU the lab's forward; where a width or dtype does not suit our kernel,
  // dropout_add_layer_norm runs PyTorch's ops
  if (!idx.is_cuda()) return GptImpl::forward(idx);
  const double p = is_training() ? options_.dropout : 0.0;
  torch::Tensor x, h;  // the residual stream (B, T, C), float32; the next layer's input
  std::tie(x, h) = amplab::dropout_add_layer_norm(/*x=*/{}, embed(idx), blocks_.front()->ln1->weight, p);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    Block& block = blocks_[i];
    std::tie(x, h) = amplab::dropout_add_layer_norm(x, block->attn->branch(h), block->ln2->weight, p);
    const torch::Tensor& next_norm = i + 1 < blocks_.size() ? blocks_[i + 1]->ln1->weight : ln_f_->weight;
    std::tie(x, h) = amplab::dropout_add_layer_norm(x, block->mlp(h), next_norm, p);
  }
  return torch::nn::functional::linear(h, wte_->weight);  // (B, T, vocab): the tied head
}

Gpt make_gpt(const GptOptions& options, bool fast_path, torch::Device device) {
  if (fast_path && fused_gpt_applies(options, device)) {
    std::shared_ptr<GptImpl> fused = std::make_shared<FusedGptImpl>(options);
    return Gpt(fused);
  }
  return Gpt(options);
}

}  // namespace transformer_fp8
