// Lab 7: the given GPT and its character data (no TODOs here; yours are in transformer_fp8.cpp).
// The model is nanoGPT's (token + position embeddings, pre-LayerNorm blocks of causal
// self-attention and a 4x GELU MLP, a final LayerNorm, the head tied to the token embedding),
// without biases (linear layers and LayerNorms, as nanoGPT's bias=False), initialised as nanoGPT
// does: N(0, 0.02), the projections back into the residual stream N(0, 0.02 / sqrt(2 * n_layer)),
// LayerNorm weights 1.
#include "gpt.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <numbers>
#include <set>

#include "amplab/infra/env.hpp"
#include "amplab/infra/error.hpp"
#include "amplab/infra/files.hpp"
#include "amplab/train/precision.hpp"

namespace transformer_fp8 {

AttentionKind attention_kind(const std::string& name) {
  if (name == "math") return AttentionKind::math;
  if (name == "safe") return AttentionKind::safe;
  if (name == "sdpa") return AttentionKind::sdpa;
  throw amplab::Error("attention '" + name + "' is not allowed; use one of: math, safe, sdpa");
}

LinearKind linear_kind(const std::string& name) {
  if (name == "plain") return LinearKind::plain;
  if (name == "fp8") return LinearKind::fp8;
  throw amplab::Error("linear '" + name + "' is not allowed; use one of: plain, fp8");
}

Fp8Scaling fp8_scaling(const std::string& name) {
  if (name == "dynamic") return Fp8Scaling::dynamic;
  if (name == "delayed") return Fp8Scaling::delayed;
  throw amplab::Error("fp8 scaling '" + name + "' is not allowed; use one of: dynamic, delayed");
}

// ---- Layers -------------------------------------------------------------------------------------

Float8LinearImpl::Float8LinearImpl(int64_t in, int64_t out, LinearKind kind, Fp8Scaling scaling, int64_t history)
    : kind_(kind),
      scaling_(scaling),
      x_history_(history, Fp8Format::e4m3),
      w_history_(history, Fp8Format::e4m3) {
  weight = register_parameter("weight", torch::randn({out, in}) * 0.02);
}

torch::Tensor Float8LinearImpl::forward(const torch::Tensor& x) {
  if (kind_ == LinearKind::plain) return torch::nn::functional::linear(x, weight);
  torch::Tensor flat = x.reshape({-1, x.size(-1)});  // (N, in)
  const auto device_type = flat.device().type();
  if (at::autocast::is_autocast_enabled(device_type))
    flat = flat.to(at::autocast::get_autocast_dtype(device_type));
  torch::Tensor x_scale, w_scale;
  {
    torch::NoGradGuard no_grad;  // scales are constants to autograd
    torch::Tensor x_amax = amax_for_cast(flat), w_amax = amax_for_cast(weight);
    if (scaling_ == Fp8Scaling::dynamic) {
      x_scale = scale_from_amax(x_amax, Fp8Format::e4m3);
      w_scale = scale_from_amax(w_amax, Fp8Format::e4m3);
    } else {  // delayed: this step's scale from the past steps' amaxes, then this one joins them
      // (the histories start on the CPU and follow the first amax: only step 1 copies its scale)
      x_scale = x_history_.scale().to(flat.device());
      w_scale = w_history_.scale().to(flat.device());
      x_history_.record(x_amax);
      w_history_.record(w_amax);
    }
  }
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = weight.size(0);
  return fp8_linear(flat, weight, x_scale, w_scale).view(shape);
}

BiasFreeLayerNormImpl::BiasFreeLayerNormImpl(int64_t width) {
  weight = register_parameter("weight", torch::ones({width}));
}

torch::Tensor BiasFreeLayerNormImpl::forward(const torch::Tensor& x) {
  return torch::layer_norm(x, {weight.size(0)}, weight, /*bias=*/{}, /*eps=*/1e-5);
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GptOptions& o)
    : n_head_(o.n_head), dropout_(o.dropout), attention_(o.attention) {
  qkv = register_module("qkv", Float8Linear(o.n_embd, 3 * o.n_embd, o.linear, o.scaling, o.amax_history));
  proj = register_module("proj", Float8Linear(o.n_embd, o.n_embd, o.linear, o.scaling, o.amax_history));
  resid_dropout_ = register_module("resid_dropout", torch::nn::Dropout(o.dropout));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) { return resid_dropout_(branch(x)); }

torch::Tensor CausalSelfAttentionImpl::branch(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
  auto heads = [&](const torch::Tensor& t) { return t.view({B, T, n_head_, C / n_head_}).transpose(1, 2); };  // (B, H, T, D)
  auto parts = qkv(x).split(C, /*dim=*/2);
  torch::Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
  const double p = is_training() ? dropout_ : 0.0;
  torch::Tensor y;
  if (attention_ == AttentionKind::math) {
    y = causal_attention(q, k, v, p, is_training());
  } else if (attention_ == AttentionKind::safe) {
    torch::Tensor causal = torch::ones({T, T}, torch::dtype(torch::kBool).device(x.device())).tril();
    y = safe_attention(q, k, v, causal, p, is_training());
  } else {
    y = torch::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, p, /*is_causal=*/true);
  }
  return proj(y.transpose(1, 2).contiguous().view({B, T, C}));
}

BlockImpl::BlockImpl(const GptOptions& o) {
  ln1 = register_module("ln1", BiasFreeLayerNorm(o.n_embd));
  attn = register_module("attn", CausalSelfAttention(o));
  ln2 = register_module("ln2", BiasFreeLayerNorm(o.n_embd));
  fc = register_module("fc", Float8Linear(o.n_embd, 4 * o.n_embd, o.linear, o.scaling, o.amax_history));
  fc_proj = register_module("fc_proj", Float8Linear(4 * o.n_embd, o.n_embd, o.linear, o.scaling, o.amax_history));
  mlp_dropout_ = register_module("mlp_dropout", torch::nn::Dropout(o.dropout));
}

torch::Tensor BlockImpl::forward(torch::Tensor x) {
  x = x + attn(ln1(x));
  return x + mlp_dropout_(mlp(ln2(x)));
}

torch::Tensor BlockImpl::mlp(const torch::Tensor& x) { return fc_proj(torch::gelu(fc(x))); }

// ---- The model ----------------------------------------------------------------------------------

GptImpl::GptImpl(const GptOptions& o) : options_(o) {
  if (o.n_embd % o.n_head != 0)
    throw amplab::Error("gpt: n_embd " + std::to_string(o.n_embd) + " is not a multiple of n_head " + std::to_string(o.n_head));
  wte_ = register_module("wte", torch::nn::Embedding(o.vocab_size, o.n_embd));
  wpe_ = register_module("wpe", torch::nn::Embedding(o.block_size, o.n_embd));
  drop_ = register_module("drop", torch::nn::Dropout(o.dropout));
  for (int64_t i = 0; i < o.n_layer; ++i) {
    std::string name = "h";
    name += std::to_string(i);
    blocks_.push_back(register_module(name, Block(o)));
  }
  ln_f_ = register_module("ln_f", BiasFreeLayerNorm(o.n_embd));
  // Every weight drawn again, in this order, from a generator of its own: bench/gpt_reference.py
  // draws the same order from the same seed, so both start from the same weights.
  torch::NoGradGuard no_grad;
  at::Generator init = at::make_generator<at::CPUGeneratorImpl>(o.init_seed);
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(o.n_layer));
  wte_->weight.normal_(0.0, 0.02, init);
  wpe_->weight.normal_(0.0, 0.02, init);
  for (auto& block : blocks_) {
    block->attn->qkv->weight.normal_(0.0, 0.02, init);
    block->attn->proj->weight.normal_(0.0, residual_std, init);
    block->fc->weight.normal_(0.0, 0.02, init);
    block->fc_proj->weight.normal_(0.0, residual_std, init);
  }
}

torch::Tensor GptImpl::embed(const torch::Tensor& idx) {
  const int64_t T = idx.size(1);
  if (T > options_.block_size)
    throw amplab::Error("gpt: a sequence of " + std::to_string(T) + " tokens is longer than block_size " +
                        std::to_string(options_.block_size));
  torch::Tensor positions = torch::arange(T, torch::dtype(torch::kInt64).device(idx.device()));
  return wte_(idx) + wpe_(positions);
}

torch::Tensor GptImpl::forward(const torch::Tensor& idx) {
  torch::Tensor x = drop_(embed(idx));  // (B, T, C)
  for (auto& block : blocks_) x = block(x);
  return torch::nn::functional::linear(ln_f_(x), wte_->weight);  // (B, T, vocab): the tied head
}

torch::Tensor GptImpl::loss(const torch::Tensor& idx, const torch::Tensor& targets) {
  torch::Tensor logits = forward(idx);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32),
                                              targets.reshape({-1}));
}

int64_t GptImpl::parameter_count() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n - wpe_->weight.numel();
}

torch::Tensor generate(Gpt& model, torch::Tensor prompt, int64_t tokens, double temperature, int64_t top_k) {
  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  torch::Tensor idx = prompt;
  const int64_t block = model->options().block_size;
  for (int64_t i = 0; i < tokens; ++i) {
    torch::Tensor context = idx.size(1) <= block ? idx : idx.slice(1, idx.size(1) - block);
    torch::Tensor logits = model(context).select(1, -1).to(torch::kFloat32) / temperature;  // (1, vocab)
    if (top_k > 0 && top_k < logits.size(-1)) {
      torch::Tensor kth = std::get<0>(logits.topk(top_k)).select(-1, -1).unsqueeze(-1);
      logits = logits.masked_fill(logits < kth, -std::numeric_limits<double>::infinity());
    }
    idx = torch::cat({idx, torch::multinomial(torch::softmax(logits, -1), 1)}, 1);
  }
  model->train(was_training);
  return idx;
}

// ---- Training recipe ---------------------------------------------------------------------------

double LrSchedule::at(int64_t it) const {
  if (it < warmup_steps) return lr * static_cast<double>(it + 1) / static_cast<double>(warmup_steps + 1);
  if (it > decay_steps) return min_lr;
  const double decayed = static_cast<double>(it - warmup_steps) / static_cast<double>(decay_steps - warmup_steps);
  return min_lr + 0.5 * (1.0 + std::cos(std::numbers::pi * decayed)) * (lr - min_lr);
}

std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>> split_for_weight_decay(
    const std::vector<torch::Tensor>& parameters) {
  std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>> groups;
  for (const auto& p : parameters) (p.dim() >= 2 ? groups.first : groups.second).push_back(p);
  return groups;
}

// ---- Data ---------------------------------------------------------------------------------------

namespace {

// The code points of UTF-8 `text`; an amplab::Error naming `source` for bytes that are not UTF-8
// or for control characters no text holds (a NUL byte: a binary file).
std::u32string utf8_characters(const std::string& text, const std::string& source) {
  std::u32string out;
  out.reserve(text.size());
  auto refuse = [&](size_t at, const std::string& what) {
    throw amplab::Error("data.dir: " + source + " is not UTF-8 text (" + what + " at byte " + std::to_string(at) +
                        "); point data.dir at a text file, as scripts/fetch-shakespeare.py writes");
  };
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    const int length = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 0;
    if (length == 0 || i + static_cast<size_t>(length) > text.size()) refuse(i, "a byte that starts no character");
    char32_t c = length == 1 ? lead : lead & (0x7F >> length);
    for (int k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + static_cast<size_t>(k)]);
      if ((next >> 6) != 0x2) refuse(i, "a character cut short");
      c = (c << 6) | (next & 0x3F);
    }
    static constexpr char32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < kSmallest[length] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) refuse(i, "an invalid character");
    if (c < 0x20 && c != '\n' && c != '\t' && c != '\r' && c != '\f') refuse(i, "a control character, code " + std::to_string(static_cast<uint32_t>(c)));
    out.push_back(c);
    i += static_cast<size_t>(length);
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

// A text file's content, refused by name when it is empty.
std::string read_text(const std::filesystem::path& file) {
  std::string text = amplab::read_file(file.string());
  if (text.empty()) throw amplab::Error("data.dir: " + file.string() + " is empty; a character model needs text to learn from");
  utf8_characters(text, file.string());  // refused here, by name, when it is not text
  return text;
}

}  // namespace

CharData CharData::from_text(const std::string& text, double train_share) {
  CharData data;
  const std::u32string characters = utf8_characters(text, "the text");
  std::set<char32_t> chars(characters.begin(), characters.end());
  data.vocab.assign(chars.begin(), chars.end());
  torch::Tensor ids = data.encode(text);
  const auto cut = static_cast<int64_t>(static_cast<double>(ids.numel()) * train_share);
  data.train = ids.slice(0, 0, cut);
  data.val = ids.slice(0, cut);
  return data;
}

CharData CharData::load(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path dir = path;
  std::error_code error;
  if (!fs::exists(dir, error) && dir.is_relative() && fs::exists(fs::path(amplab::source_dir()) / dir, error))
    dir = fs::path(amplab::source_dir()) / dir;
  if (fs::is_regular_file(dir, error)) {
    CharData data = from_text(read_text(dir));
    data.train_source = dir.string() + " (its first 90%)";
    data.val_source = dir.string() + " (its last 10%)";
    return data;
  }
  if (!fs::exists(dir / "train.txt", error) || !fs::exists(dir / "val.txt", error))
    throw amplab::Error("no Shakespeare text in " + path +
                        " (train.txt, val.txt): run '.venv/bin/python scripts/fetch-shakespeare.py' first, or set data.dir");
  const std::string train = read_text(dir / "train.txt"), val = read_text(dir / "val.txt");
  CharData data = from_text(train + val);  // the vocabulary of the whole text
  data.train = data.encode(train);
  data.val = data.encode(val);
  data.train_source = (dir / "train.txt").string();
  data.val_source = (dir / "val.txt").string();
  return data;
}

void CharData::require_context(int64_t block, const std::string& block_key) const {
  for (const auto& [split, source] : {std::pair{&train, &train_source}, std::pair{&val, &val_source}})
    if (split->numel() < block + 2)  // a window of block + 1 tokens, from one of at least two starts
      throw amplab::Error("data.dir: " + *source + " has " + std::to_string(split->numel()) +
                          " characters, too few for one context of " + block_key + " = " + std::to_string(block) +
                          " (it needs at least " + std::to_string(block + 2) + "); use a longer text or lower " + block_key);
}

torch::Tensor CharData::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  for (char32_t c : utf8_characters(text, "the text")) {
    auto at = std::lower_bound(vocab.begin(), vocab.end(), c);
    if (at == vocab.end() || *at != c)
      throw amplab::Error("a character outside the vocabulary: code point " + std::to_string(static_cast<uint32_t>(c)));
    ids.push_back(at - vocab.begin());
  }
  return torch::tensor(ids, torch::kInt64);
}

std::string CharData::decode(const torch::Tensor& ids) const {
  torch::Tensor flat = ids.to(torch::kCPU, torch::kInt64).reshape({-1}).contiguous();
  std::string out;
  const int64_t* id = flat.data_ptr<int64_t>();
  for (int64_t i = 0; i < flat.numel(); ++i) append_utf8(out, vocab.at(static_cast<size_t>(id[i])));
  return out;
}

std::pair<torch::Tensor, torch::Tensor> CharData::batch(const torch::Tensor& split, int64_t batch, int64_t block,
                                                        torch::Device device) const {
  if (split.numel() <= block + 1)
    throw amplab::Error("the text has " + std::to_string(split.numel()) + " tokens, too few for block_size " +
                        std::to_string(block));
  torch::Tensor starts = torch::randint(split.numel() - block - 1, {batch, 1}, torch::kInt64);  // (B, 1)
  torch::Tensor index = starts + torch::arange(block + 1, torch::kInt64);                    // (B, T + 1)
  torch::Tensor windows = split.index({index}).to(device);
  return {windows.slice(1, 0, block), windows.slice(1, 1)};
}

SpeedMlp::SpeedMlp(int64_t width, int64_t layers, int64_t batch, LinearKind kind, Fp8Scaling scaling,
                   torch::Device device, Forward forward)
    : device_(device), other_forward_(std::move(forward)) {
  torch::manual_seed(0);
  for (int64_t i = 0; i < layers; ++i) {
    layers_.emplace_back(width, width, kind, scaling, /*history=*/16);
    layers_.back()->to(device);
  }
  x_ = torch::randn({batch, width}, torch::TensorOptions().device(device));
}

torch::Tensor SpeedMlp::forward() {
  torch::Tensor y = x_;
  amplab::AutocastGuard autocast(device_.type(), torch::kBFloat16);
  if (other_forward_) {
    std::vector<torch::Tensor> weights;
    for (auto& layer : layers_) weights.push_back(layer->weight);
    return other_forward_(y, weights).to(torch::kFloat32);
  }
  for (auto& layer : layers_) y = torch::relu(layer(y));
  return y.to(torch::kFloat32);
}

void SpeedMlp::step() {
  for (auto& layer : layers_) layer->zero_grad();  // gradients set to none, as a training step leaves them
  forward().mean().backward();
}

std::vector<torch::Tensor> SpeedMlp::gradients() const {
  std::vector<torch::Tensor> out;
  for (const auto& layer : layers_) out.push_back(layer->weight.grad());
  return out;
}

double SpeedMlp::fit(int64_t steps, double lr) {
  std::vector<torch::Tensor> parameters;
  for (auto& layer : layers_) parameters.push_back(layer->weight);
  torch::optim::Adam adam(parameters, torch::optim::AdamOptions(lr));
  torch::manual_seed(1);
  const torch::Tensor target = torch::rand(x_.sizes(), x_.options());  // >= 0, as the ReLU's outputs
  torch::Tensor loss;
  for (int64_t i = 0; i < steps; ++i) {
    adam.zero_grad();
    loss = torch::mse_loss(forward(), target);
    loss.backward();
    adam.step();
  }
  return loss.item<double>();
}

}  // namespace transformer_fp8
