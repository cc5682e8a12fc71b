#include "amplab/fast/fused_fp8_mlp.hpp"

#include <ATen/ops/_scaled_mm.h>
#include <torch/autograd.h>

#include <string>

#include "amplab/infra/error.hpp"

#if AMPLAB_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>

#include "amplab/fast/cuda/fp8_cast_kernels.hpp"
#endif

namespace amplab {

namespace {

using State = Fp8ReluMlp::State;
using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

constexpr double kAmaxFloor = 1e-12;  // an all-zero tensor gets a large finite scale, not inf
constexpr double kE4m3Max = 448.0, kE5m2Max = 57344.0;

// Each layer l has three scaled tensors: its input, its weight, its output's gradient.
int64_t input_state(int64_t layer) { return 3 * layer; }
int64_t weight_state(int64_t layer) { return 3 * layer + 1; }
int64_t grad_state(int64_t layer) { return 3 * layer + 2; }

enum class CastInput { plain, round_bf16, relu, gated };  // as cuda::Fp8CastInput

struct Fp8Pair {
  torch::Tensor data, transposed;  // (rows, cols) and (cols, rows); either undefined when not asked for
};

// A scale and its inverse are (0-dim views of) the first float of 16 bytes each: cuBLASLt refuses
// (CUBLAS_STATUS_NOT_SUPPORTED) a scale pointer that is not 16-byte aligned.
torch::Tensor scale_of(const State& s, int64_t i) { return s.scales[i][0][0]; }
torch::Tensor inverse_of(const State& s, int64_t i) { return s.scales[i][1][0]; }

// The values a cast takes, in float32, by PyTorch's ops (the kernels compute the same).
torch::Tensor cast_input(const torch::Tensor& x, CastInput input, const torch::Tensor& gate) {
  switch (input) {
    case CastInput::round_bf16: return x.to(torch::kBFloat16).to(torch::kFloat32);
    case CastInput::relu: return torch::relu(x.to(torch::kFloat32));
    case CastInput::gated: return x.to(torch::kFloat32).masked_fill(gate <= 0, 0);
    case CastInput::plain: break;
  }
  return x.to(torch::kFloat32);
}

// State i's scale from its pending amax (the first call's: this step's own tensor).
void scale_from_pending(State& s, int64_t i) {
  const torch::Tensor amax = s.pending[i];
  const torch::Tensor scale = torch::where(amax > 0, s.limits[i] / amax.clamp_min(kAmaxFloor), torch::ones_like(amax));
  s.scales[i].select(1, 0).copy_(torch::stack({scale, scale.reciprocal()}));
}

// Casts x (as `input` says) to `format` with state i's scale, in the layouts asked for, and raises
// state i's pending amax to the largest |value|. `prime`: state i's scale comes from this amax.
Fp8Pair cast(State& s, const torch::Tensor& x, CastInput input, const torch::Tensor& gate, int64_t i,
             torch::ScalarType format, bool plain, bool transposed, bool prime) {
  Fp8Pair r;
  torch::Tensor amax = s.pending[i];
#if AMPLAB_WITH_CUDA
  if (s.fused && cuda::fp8_cast_supported(x, input == CastInput::gated ? gate : torch::Tensor())) {
    const auto kind = static_cast<cuda::Fp8CastInput>(input);
    if (prime) {
      cuda::fp8_cast(x, kind, gate, scale_of(s, i), {}, {}, amax);
      scale_from_pending(s, i);
    }
    const auto bytes = x.options().dtype(format);
    if (plain) r.data = torch::empty({x.size(0), x.size(1)}, bytes);
    if (transposed) r.transposed = torch::empty({x.size(1), x.size(0)}, bytes);
    cuda::fp8_cast(x, kind, gate, scale_of(s, i), r.data, r.transposed, amax);
    return r;
  }
#endif
  const torch::Tensor values = cast_input(x, input, gate);
  amax.copy_(torch::maximum(amax, values.abs().amax()));
  if (prime) scale_from_pending(s, i);
  const double limit = format == torch::kFloat8_e4m3fn ? kE4m3Max : kE5m2Max;
  const torch::Tensor q = (values * scale_of(s, i)).clamp(-limit, limit).to(format);
  if (plain) r.data = q;
  if (transposed) r.transposed = q.t().contiguous();
  return r;
}

// The step's scales from the past steps' amaxes; this step's amaxes start from 0.
void advance(State& s) {
#if AMPLAB_WITH_CUDA
  if (s.fused && s.history.is_cuda()) {
    cuda::fp8_scales_advance(s.history, s.pending, s.next, s.limits, s.scales);
    return;
  }
#endif
  const int64_t slot = s.next.item<int>(), length = s.history.size(1);
  s.history.select(1, slot).copy_(s.pending);
  s.pending.zero_();
  const torch::Tensor largest = s.history.amax(1);
  const torch::Tensor scale =
      torch::where(largest > 0, s.limits / largest.clamp_min(kAmaxFloor), torch::ones_like(largest));
  s.scales.select(2, 0).select(1, 0).copy_(scale);
  s.scales.select(2, 0).select(1, 1).copy_(scale.reciprocal());
  s.next.fill_((slot + 1) % length);
}

// What backward needs of the state: the same tensors (shared storage), not the MLP that owns them.
void save_state(AutogradContext* ctx, const State& s, bool prime) {
  ctx->saved_data["pending"] = s.pending;
  ctx->saved_data["limits"] = s.limits;
  ctx->saved_data["scales"] = s.scales;
  ctx->saved_data["fused"] = s.fused;
  ctx->saved_data["prime"] = prime;
}

State load_state(AutogradContext* ctx) {
  State s;
  s.pending = ctx->saved_data["pending"].toTensor();
  s.limits = ctx->saved_data["limits"].toTensor();
  s.scales = ctx->saved_data["scales"].toTensor();
  s.fused = ctx->saved_data["fused"].toBool();
  return s;
}

// The forward's matrix product, z = x8 w8^T in bfloat16, with fast accumulation on a GPU, as
// torchao's forward does (the gradients' products keep the full accumulation). On a Hopper GPU it
// goes through the rowwise kernel, every row's scale the tensor's one: the same products but for
// the order of the sums, and on an H200 the MLP's step took 10.69 ms this way against 10.77
// tensorwise with fast accumulation and 10.92 without.
bool rowwise_kernel_is_faster(const torch::Tensor& x8) {
#if AMPLAB_WITH_CUDA
  return x8.is_cuda() && at::cuda::getDeviceProperties(x8.device().index())->major == 9;
#else
  (void)x8;
  return false;
#endif
}

torch::Tensor forward_matmul(const torch::Tensor& x8, const torch::Tensor& w8, const torch::Tensor& x_inv,
                             const torch::Tensor& w_inv) {
  if (rowwise_kernel_is_faster(x8)) {
    const auto rows = x_inv.expand({x8.size(0), 1}).contiguous(), cols = w_inv.expand({1, w8.size(0)}).contiguous();
    return at::_scaled_mm(x8, w8.t(), rows, cols, {}, {}, torch::kBFloat16, /*use_fast_accum=*/true);
  }
  return at::_scaled_mm(x8, w8.t(), x_inv, w_inv, {}, {}, torch::kBFloat16, /*use_fast_accum=*/x8.is_cuda());
}

struct Fp8ReluMlpFunction : torch::autograd::Function<Fp8ReluMlpFunction> {
  // Saved per layer: the input's and the weight's transposed casts, and the ReLU's input after the
  // layer (the last layer: the output, positive where its input is).
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, at::TensorList weights, State* state) {
    State& s = *state;
    const bool prime = !s.primed, x_grad = x.requires_grad();
    const auto layers = static_cast<int64_t>(weights.size());
    advance(s);
    std::vector<torch::Tensor> saved;
    torch::Tensor input = x;
    for (int64_t l = 0; l < layers; ++l) {
      const CastInput how = l > 0 ? CastInput::relu : x.scalar_type() == torch::kFloat ? CastInput::round_bf16 : CastInput::plain;
      const Fp8Pair x8 = cast(s, input, how, {}, input_state(l), torch::kFloat8_e4m3fn, true, weights[l].requires_grad(), prime);
      const Fp8Pair w8 = cast(s, weights[l], CastInput::plain, {}, weight_state(l), torch::kFloat8_e4m3fn, true,
                              l > 0 || x_grad, prime);
      input = forward_matmul(x8.data, w8.data, inverse_of(s, input_state(l)), inverse_of(s, weight_state(l)));
      saved.insert(saved.end(), {x8.transposed, w8.transposed, input});
    }
    torch::Tensor out = torch::relu(input);
    saved.back() = out;
    ctx->save_for_backward(saved);
    save_state(ctx, s, prime);
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["x_grad"] = x_grad;
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    State s = load_state(ctx);
    const bool prime = ctx->saved_data["prime"].toBool(), x_grad = ctx->saved_data["x_grad"].toBool();
    const tensor_list saved = ctx->get_saved_variables();
    const auto layers = static_cast<int64_t>(saved.size()) / 3;
    tensor_list result(layers + 2);  // x, the weights, the state
    torch::Tensor g = grads[0].to(torch::kBFloat16).contiguous();  // d loss / d (layer l's ReLU output)
    for (int64_t l = layers - 1; l >= 0; --l) {
      const torch::Tensor &x8_t = saved[3 * l], &w8_t = saved[3 * l + 1], &gate = saved[3 * l + 2];
      const bool need_dx = l > 0 || x_grad, need_dw = ctx->needs_input_grad(1 + l);
      const Fp8Pair g8 = cast(s, g, CastInput::gated, gate, grad_state(l), torch::kFloat8_e5m2, need_dx, need_dw, prime);
      if (need_dw)
        result[1 + l] = at::_scaled_mm(g8.transposed, x8_t.t(), inverse_of(s, grad_state(l)),
                                       inverse_of(s, input_state(l)), {}, {}, torch::kFloat32);
      if (need_dx)
        g = at::_scaled_mm(g8.data, w8_t.t(), inverse_of(s, grad_state(l)), inverse_of(s, weight_state(l)), {}, {},
                           torch::kBFloat16);
    }
    if (x_grad) result[0] = g.to(static_cast<torch::ScalarType>(ctx->saved_data["x_dtype"].toInt()));
    return result;
  }
};

void check_shapes(const torch::Tensor& x, const std::vector<torch::Tensor>& weights) {
  if (weights.empty()) throw Error("Fp8ReluMlp: no weights (one per layer)");
  if (x.dim() != 2 || (x.scalar_type() != torch::kFloat && x.scalar_type() != torch::kBFloat16))
    throw Error("Fp8ReluMlp: x must be a 2-D float32 or bfloat16 tensor (N, in)");
  int64_t width = x.size(1);
  for (size_t l = 0; l < weights.size(); ++l) {
    const torch::Tensor& w = weights[l];
    if (w.dim() != 2 || w.size(1) != width || w.scalar_type() != torch::kFloat)
      throw Error("Fp8ReluMlp: weights[" + std::to_string(l) + "] must be float32 (out, " + std::to_string(width) + ")");
    width = w.size(0);
    if (w.size(0) % 16 != 0 || w.size(1) % 16 != 0 || x.size(0) % 16 != 0)
      throw Error("Fp8ReluMlp: every size must be a multiple of 16 (the FP8 matmul's rule); weights[" +
                  std::to_string(l) + "] is " + std::to_string(w.size(0)) + " x " + std::to_string(w.size(1)) +
                  ", x has " + std::to_string(x.size(0)) + " rows");
  }
}

}  // namespace

Fp8ReluMlp::Fp8ReluMlp(int64_t history, bool kernels) : history_(history), kernels_(kernels) {
  if (history < 1) throw Error("Fp8ReluMlp: the amax history needs at least 1 step, got " + std::to_string(history));
}

torch::Tensor Fp8ReluMlp::forward(const torch::Tensor& x, const std::vector<torch::Tensor>& weights) {
  check_shapes(x, weights);
  const auto states = static_cast<int64_t>(3 * weights.size());
  if (!state_.history.defined()) {
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(x.device());
    state_.history = torch::zeros({states, history_}, f32);
    state_.pending = torch::zeros({states}, f32);
    state_.next = torch::zeros({1}, f32.dtype(torch::kInt32));
    std::vector<float> limits(states);
    for (int64_t i = 0; i < states; ++i) limits[i] = i == grad_state(i / 3) ? kE5m2Max : kE4m3Max;
    state_.limits = torch::tensor(limits).to(x.device());
    state_.scales = torch::ones({states, 2, 4}, f32);
    state_.fused = kernels_ && x.is_cuda();
  }
  if (state_.history.size(0) != states || state_.history.device() != x.device())
    throw Error("Fp8ReluMlp: one MLP keeps one scaling state: it was first called with " +
                std::to_string(state_.history.size(0) / 3) + " layers on " + state_.history.device().str() +
                ", now with " + std::to_string(weights.size()) + " on " + x.device().str());
  torch::Tensor y = Fp8ReluMlpFunction::apply(x, at::TensorList(weights), &state_);
  // The gradients' scales are primed by this call's backward; without one (no grad) the next call primes them.
  if (torch::GradMode::is_enabled()) state_.primed = true;
  return y;
}

}  // namespace amplab
