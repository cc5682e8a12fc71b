// Lab 8's models (given, no TODOs: labs/sharded_training/given/models.cpp): the MLP the lab starts
// with and lab 7's GPT at GPT-2's sizes. Each says what the sharding stages need to know about it:
// its units, the modules whose parameters ZeRO-2 reduces as one bucket and ZeRO-3 gathers as one
// flat buffer, and a forward that runs each unit's part through a runner that ZeRO-3 wraps with
// its gathers.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace zero_lab {

// Runs unit `unit`'s part of forward (`part`) and returns its output. Plain training calls
// `part()`; ZeRO-3 gathers the unit's parameters around it (FullyShardedModel::run_unit).
using UnitRunner = std::function<torch::Tensor(size_t unit, const std::function<torch::Tensor()>& part)>;

class LabModel : public torch::nn::Module {
 public:
  // The units, in the order forward first uses them. Every parameter belongs to exactly one.
  virtual std::vector<std::shared_ptr<torch::nn::Module>> units() = 0;
  // Units whose part runs twice in one forward (the GPT's embedding, whose matrix is also the
  // output layer's): ZeRO-3 keeps them whole from their first part to their backward, as FSDP
  // keeps its root.
  virtual std::vector<size_t> units_used_twice() const { return {}; }
  // The model's output for `input`, each unit's part run through `run`.
  virtual torch::Tensor forward(const torch::Tensor& input, const UnitRunner& run) = 0;
  torch::Tensor forward(const torch::Tensor& input);  // every part run as it is
  // The training loss of `output` against `target`, in fp32.
  virtual torch::Tensor loss(const torch::Tensor& output, const torch::Tensor& target) const = 0;
  // One step's batch on `rank` of `world` ranks: its rows of a global batch drawn from `seed`
  // and the step, on `device` ({input, target}). Every stage sees the same batches.
  virtual std::pair<torch::Tensor, torch::Tensor> batch(uint64_t seed, int step, int rank, int world,
                                                        torch::Device device) const = 0;
};

// layers x Linear(width, width), ReLU between, each Linear a unit; MSE against sin(2x) rolled
// by one column. Built from `seed` on the CPU, so every rank makes the same one.
class Mlp : public LabModel {
 public:
  Mlp(int64_t width, int64_t layers, int64_t batch, uint64_t seed);
  explicit Mlp(torch::nn::Sequential layers, int64_t batch = 0);  // any Linear/activation stack
  std::vector<std::shared_ptr<torch::nn::Module>> units() override;
  using LabModel::forward;
  torch::Tensor forward(const torch::Tensor& input, const UnitRunner& run) override;
  torch::Tensor loss(const torch::Tensor& output, const torch::Tensor& target) const override;
  std::pair<torch::Tensor, torch::Tensor> batch(uint64_t seed, int step, int rank, int world,
                                                torch::Device device) const override;
  torch::nn::Sequential layers;

 private:
  int64_t batch_ = 0;
};

struct GptEnds;   // given/models.cpp
struct GptBlock;

struct GptShape {
  int64_t layers = 2, width = 64, heads = 4, context = 32, vocab = 256, batch = 4;  // batch: sequences a rank
};

// Lab 7's GPT with GPT-2's biases (GPT-2 small: 12 layers, width 768, 12 heads, context 1024,
// vocabulary 50257, padded to 50304): pre-LayerNorm blocks of causal self-attention (torch's
// fused SDPA) and a GELU MLP, the output layer tied to the token embedding, no dropout; the
// loss is next-token cross-entropy on random tokens. Units: the embeddings with the final
// LayerNorm (used twice: first and last), then one unit per block.
class Gpt : public LabModel {
 public:
  Gpt(GptShape shape, uint64_t seed);
  std::vector<std::shared_ptr<torch::nn::Module>> units() override;
  std::vector<size_t> units_used_twice() const override { return {0}; }
  using LabModel::forward;
  torch::Tensor forward(const torch::Tensor& input, const UnitRunner& run) override;  // (B, T) tokens -> (B, T, vocab)
  torch::Tensor loss(const torch::Tensor& output, const torch::Tensor& target) const override;
  std::pair<torch::Tensor, torch::Tensor> batch(uint64_t seed, int step, int rank, int world,
                                                torch::Device device) const override;

 private:
  GptShape shape_;
  std::shared_ptr<GptEnds> ends_;  // the token and position embeddings and the final LayerNorm
  std::vector<std::shared_ptr<GptBlock>> blocks_;
};

}  // namespace zero_lab
