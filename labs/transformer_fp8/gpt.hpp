// Lab 7: the given GPT (a character-level model of nanoGPT's Shakespeare-char size by default)
// and its data. Its attention calls your causal_attention / safe_attention (or torch's SDPA), and
// its linear layers can run on your fp8_linear with dynamic or delayed scaling
// (transformer_fp8.hpp). Code: labs/transformer_fp8/given/gpt.cpp (given, no TODOs).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "transformer_fp8.hpp"

namespace transformer_fp8 {

enum class AttentionKind { math, safe, sdpa };  // your TODO 1, your TODO 2, torch's fused SDPA
enum class LinearKind { plain, fp8 };           // torch's linear (autocast decides its dtype), your TODO 4
enum class Fp8Scaling { dynamic, delayed };     // scales from this step's amax, or from the history (TODO 5)

AttentionKind attention_kind(const std::string& name);  // "math" | "safe" | "sdpa", else an amplab::Error
LinearKind linear_kind(const std::string& name);        // "plain" | "fp8"
Fp8Scaling fp8_scaling(const std::string& name);        // "dynamic" | "delayed"

struct GptOptions {
  int64_t vocab_size = 65;
  int64_t block_size = 256;  // context length T
  int64_t n_layer = 6;
  int64_t n_head = 6;
  int64_t n_embd = 384;      // width C; each head is C / n_head wide
  double dropout = 0.2;
  AttentionKind attention = AttentionKind::sdpa;
  LinearKind linear = LinearKind::plain;
  Fp8Scaling scaling = Fp8Scaling::dynamic;
  int64_t amax_history = 16;  // steps of amax kept for delayed scaling
  uint64_t init_seed = 0;     // the initial weights' own CPU generator (the same weights as the Python reference's)
};

// A bias-free linear layer (out, in) that runs either as torch's linear or as your FP8 linear.
// FP8: under autocast the input is first cast to autocast's dtype (as autocast does for a
// linear), so the output comes back in bf16; the weight stays the fp32 master copy.
class Float8LinearImpl : public torch::nn::Module {
 public:
  Float8LinearImpl(int64_t in, int64_t out, LinearKind kind, Fp8Scaling scaling, int64_t history);
  torch::Tensor forward(const torch::Tensor& x);  // (..., in) -> (..., out)
  torch::Tensor weight;

 private:
  LinearKind kind_;
  Fp8Scaling scaling_;
  AmaxHistory x_history_, w_history_;
};
TORCH_MODULE(Float8Linear);

// LayerNorm with a weight and no bias (nanoGPT's Shakespeare-char model has no biases at all).
class BiasFreeLayerNormImpl : public torch::nn::Module {
 public:
  explicit BiasFreeLayerNormImpl(int64_t width);
  torch::Tensor forward(const torch::Tensor& x);  // normalized over the last dimension, times weight
  torch::Tensor weight;
};
TORCH_MODULE(BiasFreeLayerNorm);

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GptOptions& o);
  torch::Tensor forward(const torch::Tensor& x);  // (B, T, C) -> (B, T, C): resid_dropout(branch(x))
  torch::Tensor branch(const torch::Tensor& x);   // attention and its projection, before the dropout
  Float8Linear qkv{nullptr}, proj{nullptr};

 private:
  int64_t n_head_;
  double dropout_;
  AttentionKind attention_;
  torch::nn::Dropout resid_dropout_{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GptOptions& o);
  torch::Tensor forward(torch::Tensor x);  // pre-LayerNorm: x + attn(ln1(x)), then x + dropout(mlp(ln2(x)))
  torch::Tensor mlp(const torch::Tensor& x);  // fc_proj(gelu(fc(x))), before the dropout
  BiasFreeLayerNorm ln1{nullptr}, ln2{nullptr};
  CausalSelfAttention attn{nullptr};
  Float8Linear fc{nullptr}, fc_proj{nullptr};  // the MLP: C -> 4C, GELU, 4C -> C

 private:
  torch::nn::Dropout mlp_dropout_{nullptr};
};
TORCH_MODULE(Block);

class GptImpl : public torch::nn::Module {
 public:
  explicit GptImpl(const GptOptions& o);
  // (B, T) int64 tokens -> (B, T, vocab) logits. Virtual: a program's fast path may compute the
  // same model in fewer kernels (the members below are its parameters).
  virtual torch::Tensor forward(const torch::Tensor& idx);
  // Mean cross-entropy of next-token prediction, in float32.
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets);
  const GptOptions& options() const { return options_; }
  int64_t parameter_count() const;  // without the position embeddings, as nanoGPT reports it

 protected:
  torch::Tensor embed(const torch::Tensor& idx);  // token + position embeddings, (B, T, C), before the dropout
  GptOptions options_;
  torch::nn::Embedding wte_{nullptr}, wpe_{nullptr};  // token (also the head's weight: tied), position
  torch::nn::Dropout drop_{nullptr};
  std::vector<Block> blocks_;
  BiasFreeLayerNorm ln_f_{nullptr};
};
TORCH_MODULE(Gpt);

// nanoGPT's training recipe around the model (its train.py and configure_optimizers).
// The learning rate of 0-based step `it`: linear warm-up to `lr` over `warmup_steps`
// (lr * (it + 1) / (warmup_steps + 1)), then a cosine from `lr` down to `min_lr` at `decay_steps`,
// `min_lr` after that.
struct LrSchedule {
  double lr = 1e-3, min_lr = 1e-4;
  int64_t warmup_steps = 100, decay_steps = 5000;
  double at(int64_t it) const;
};
// Weight decay on the matrices only (linear weights, embeddings: 2-D and more), none on the
// LayerNorms' weights: `parameters` split into {decayed, not decayed}.
std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>> split_for_weight_decay(
    const std::vector<torch::Tensor>& parameters);

// The MLP of the lab's FP8 speed table (given): `layers` x Float8Linear(width, width) with ReLU
// between, fp32 weights (the master copy), and one training step's forward and backward of a
// (batch, width) input under bf16 autocast. LinearKind::plain is torch's linear (bf16 matmuls).
class SpeedMlp {
 public:
  // Another computation of the same MLP, given its input and the layers' weights (for a faster
  // FP8 MLP's row beside yours): relu after every layer, the output in autocast's dtype.
  using Forward = std::function<torch::Tensor(const torch::Tensor& x, const std::vector<torch::Tensor>& weights)>;
  SpeedMlp(int64_t width, int64_t layers, int64_t batch, LinearKind kind, Fp8Scaling scaling, torch::Device device,
           Forward forward = {});
  void step();  // a training step's forward + backward: the gradients set to none first, as zero_grad leaves them
  torch::Tensor input() const { return x_; }      // the batch each step computes on (fill it anew in place)
  std::vector<torch::Tensor> gradients() const;  // each layer's weight gradient after step()
  // Trains `steps` Adam steps (learning rate `lr`) towards a fixed random target under mean
  // squared error, from the weights as they are; the last step's loss. The same seed gives every
  // kind the same weights, input and target, so the losses compare the precisions.
  double fit(int64_t steps, double lr);

 private:
  torch::Tensor forward();  // the ReLU MLP on x_ under bf16 autocast, its output in float32
  std::vector<Float8Linear> layers_;
  torch::Tensor x_;
  torch::Device device_;
  Forward other_forward_;
};

// Continues `prompt` (1, T0) by `tokens` sampled tokens (temperature, top-k), in eval mode.
torch::Tensor generate(Gpt& model, torch::Tensor prompt, int64_t tokens, double temperature, int64_t top_k);

// A UTF-8 text as characters, one token per Unicode code point (as Python's str counts them,
// nanoGPT's shakespeare_char): the vocabulary is the sorted set of the whole text's characters.
struct CharData {
  std::u32string vocab;      // the character (code point) of each token id
  torch::Tensor train, val;  // 1-D int64 token ids (CPU)
  std::string train_source = "the training text", val_source = "the validation text";  // for messages

  // The text of `path`/train.txt and val.txt (or, for a file path, that file split 90/10).
  // Missing files: an amplab::Error naming scripts/fetch-shakespeare.py; an empty file, or one
  // that is not UTF-8 text (a binary file): an amplab::Error naming it and data.dir.
  static CharData load(const std::string& path);
  static CharData from_text(const std::string& text, double train_share = 0.9);
  // An amplab::Error naming the split's file when it is too short for one context of `block`
  // tokens and its next-token target (`block_key`: the config key that sets it).
  void require_context(int64_t block, const std::string& block_key) const;
  torch::Tensor encode(const std::string& text) const;  // 1-D int64; an amplab::Error for a character not in the vocabulary
  std::string decode(const torch::Tensor& ids) const;   // UTF-8, whole characters
  // `batch` random windows of `block` tokens from `split`, inputs and targets (shifted by one),
  // both (batch, block) int64 on `device`.
  std::pair<torch::Tensor, torch::Tensor> batch(const torch::Tensor& split, int64_t batch, int64_t block,
                                                torch::Device device) const;
};

}  // namespace transformer_fp8
