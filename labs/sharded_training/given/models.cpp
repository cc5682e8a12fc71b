// Lab 8's models (models.hpp): given, no TODOs. The MLP, and lab 7's GPT with GPT-2's biases
// and sizes, written as units for the sharding stages.
#include "models.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "amplab/infra/error.hpp"

namespace zero_lab {

torch::Tensor LabModel::forward(const torch::Tensor& input) {
  return forward(input, [](size_t, const std::function<torch::Tensor()>& part) { return part(); });
}

// ---------------------------------------------------------------- the MLP

Mlp::Mlp(int64_t width, int64_t layers, int64_t batch, uint64_t seed) : batch_(batch) {
  torch::manual_seed(seed);  // every rank builds the same one (the init runs on the CPU)
  for (int64_t i = 0; i < layers; ++i) {
    this->layers->push_back(torch::nn::Linear(width, width));
    if (i + 1 < layers) this->layers->push_back(torch::nn::ReLU());
  }
  register_module("layers", this->layers);
}

Mlp::Mlp(torch::nn::Sequential stack, int64_t batch) : layers(std::move(stack)), batch_(batch) {
  register_module("layers", layers);
}

std::vector<std::shared_ptr<torch::nn::Module>> Mlp::units() {
  std::vector<std::shared_ptr<torch::nn::Module>> out;
  for (const auto& layer : layers->children()) {
    if (layer->parameters().empty()) continue;
    if (layer->as<torch::nn::LinearImpl>() == nullptr)
      throw amplab::Error("Mlp: layer '" + layer->name() + "' has parameters but is not a Linear");
    out.push_back(layer);
  }
  return out;
}

torch::Tensor Mlp::forward(const torch::Tensor& input, const UnitRunner& run) {
  torch::Tensor h = input;
  size_t unit = 0;
  for (auto& layer : *layers) {
    if (layer.ptr()->parameters().empty())
      h = layer.forward(h);
    else
      h = run(unit++, [&] { return layer.forward(h); });
  }
  return h;
}

torch::Tensor Mlp::loss(const torch::Tensor& output, const torch::Tensor& target) const {
  return torch::mse_loss(output.to(torch::kFloat32), target);
}

std::pair<torch::Tensor, torch::Tensor> Mlp::batch(uint64_t seed, int step, int rank, int world, torch::Device device) const {
  const int64_t width = layers->children().front()->as<torch::nn::LinearImpl>()->options.in_features();
  auto gen = at::detail::createCPUGenerator(seed * 1000003 + static_cast<uint64_t>(step));
  auto x = at::randn({batch_ * world, width}, gen).narrow(0, batch_ * rank, batch_);
  auto y = torch::sin(x * 2).roll(1, 1);
  return {x.to(device), y.to(device)};
}

// ---------------------------------------------------------------- the GPT

// The token and position embeddings (the first part) and the final LayerNorm with the output
// layer, whose matrix is the token embedding's (the last part).
struct GptEnds : torch::nn::Module {
  GptEnds(const GptShape& s)
      : wte(register_module("wte", torch::nn::Embedding(s.vocab, s.width))),
        wpe(register_module("wpe", torch::nn::Embedding(s.context, s.width))),
        ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.width})))) {}
  torch::Tensor embed(const torch::Tensor& idx) {
    auto positions = torch::arange(idx.size(1), torch::TensorOptions().dtype(torch::kLong).device(idx.device()));
    return wte(idx) + wpe(positions);
  }
  torch::Tensor head(const torch::Tensor& h) { return torch::linear(ln_f(h), wte->weight); }
  torch::nn::Embedding wte, wpe;
  torch::nn::LayerNorm ln_f;
};

// x + attention(ln_1(x)), then x + mlp(ln_2(x)).
struct GptBlock : torch::nn::Module {
  GptBlock(const GptShape& s)
      : heads(s.heads),
        ln_1(register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.width})))),
        c_attn(register_module("c_attn", torch::nn::Linear(s.width, 3 * s.width))),
        attn_proj(register_module("attn_proj", torch::nn::Linear(s.width, s.width))),
        ln_2(register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.width})))),
        c_fc(register_module("c_fc", torch::nn::Linear(s.width, 4 * s.width))),
        mlp_proj(register_module("mlp_proj", torch::nn::Linear(4 * s.width, s.width))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
    auto qkv = c_attn(ln_1(x)).split(C, 2);
    auto heads_of = [&](const torch::Tensor& t) { return t.view({B, T, heads, C / heads}).transpose(1, 2); };
    auto y = at::scaled_dot_product_attention(heads_of(qkv[0]), heads_of(qkv[1]), heads_of(qkv[2]), {}, 0.0,
                                              /*is_causal=*/true);
    auto h = x + attn_proj(y.transpose(1, 2).contiguous().view({B, T, C}));
    return h + mlp_proj(torch::gelu(c_fc(ln_2(h)), "tanh"));
  }
  int64_t heads;
  torch::nn::LayerNorm ln_1;
  torch::nn::Linear c_attn, attn_proj;
  torch::nn::LayerNorm ln_2;
  torch::nn::Linear c_fc, mlp_proj;
};

Gpt::Gpt(GptShape shape, uint64_t seed) : shape_(shape) {
  if (shape.width % shape.heads != 0)
    throw amplab::Error("model.width: " + std::to_string(shape.width) + " is not a multiple of model.heads (" +
                        std::to_string(shape.heads) + ")");
  ends_ = register_module("ends", std::make_shared<GptEnds>(shape));
  for (int64_t b = 0; b < shape.layers; ++b)
    blocks_.push_back(register_module("block" + std::to_string(b), std::make_shared<GptBlock>(shape)));
  // GPT-2's initialization: N(0, 0.02) matrices, zero biases, the projections into the residual
  // stream scaled down by sqrt(2 x layers) (two per block add to it). Drawn on the CPU from a
  // generator of its own: every rank builds the same model, even ranks that are threads.
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(seed);
  for (auto& item : named_parameters()) {
    const std::string& name = item.key();
    torch::Tensor& p = item.value();
    const bool layer_norm = name.find("ln_") != std::string::npos;
    if (layer_norm) continue;  // ones and zeros already
    if (p.dim() == 1) {
      p.zero_();
    } else {
      const bool projection = name.find("_proj.weight") != std::string::npos;
      p.normal_(0, projection ? 0.02 / std::sqrt(2.0 * static_cast<double>(shape.layers)) : 0.02, gen);
    }
  }
}

std::vector<std::shared_ptr<torch::nn::Module>> Gpt::units() {
  std::vector<std::shared_ptr<torch::nn::Module>> out{ends_};
  out.insert(out.end(), blocks_.begin(), blocks_.end());
  return out;
}

torch::Tensor Gpt::forward(const torch::Tensor& input, const UnitRunner& run) {
  torch::Tensor h = run(0, [&] { return ends_->embed(input); });
  for (size_t b = 0; b < blocks_.size(); ++b) h = run(1 + b, [&] { return blocks_[b]->forward(h); });
  return run(0, [&] { return ends_->head(h); });
}

torch::Tensor Gpt::loss(const torch::Tensor& output, const torch::Tensor& target) const {
  return torch::nn::functional::cross_entropy(output.to(torch::kFloat32).view({-1, shape_.vocab}), target.reshape(-1));
}

std::pair<torch::Tensor, torch::Tensor> Gpt::batch(uint64_t seed, int step, int rank, int world, torch::Device device) const {
  auto gen = at::detail::createCPUGenerator(seed * 1000003 + static_cast<uint64_t>(step));
  auto tokens = at::randint(shape_.vocab, {shape_.batch * world, shape_.context + 1}, gen, torch::kLong)
                    .narrow(0, shape_.batch * rank, shape_.batch);
  return {tokens.narrow(1, 0, shape_.context).to(device), tokens.narrow(1, 1, shape_.context).to(device)};
}

}  // namespace zero_lab
