// Lab 7, given (no TODOs): the GPU tables of the FP8 part: the FP8 MLP against bf16 (speed and
// loss), the casts' bandwidth (your TODO 3 and TODO 7), single matmuls in bf16 and FP8.
#include "fp8_tables.hpp"

#include <ATen/ops/_scaled_mm.h>

#include <cmath>
#include <string>
#include <utility>

#include "amplab/infra/error.hpp"
#include "amplab/infra/log.hpp"
#include "amplab/measure/timing.hpp"
#include "gpt.hpp"

namespace transformer_fp8 {
namespace {

// The lab's speed MLP (4 x Linear(8192), batch 8192, bf16 autocast): ms per forward + backward,
// and the loss after kMlpFitSteps Adam steps from the same start.
struct MlpResult {
  double ms = NAN, loss = NAN;
};
constexpr int64_t kMlpFitSteps = 50;
MlpResult mlp_row(torch::Device device, LinearKind kind, Fp8Scaling scaling = Fp8Scaling::dynamic,
                  const std::function<SpeedMlp::Forward()>& other = {}) {
  MlpResult result;
  {
    SpeedMlp mlp(8192, 4, 8192, kind, scaling, device, other ? other() : SpeedMlp::Forward());
    for (int i = 0; i < 3; ++i) mlp.step();
    result.ms = amplab::summarize(amplab::time_back_to_back([&] { mlp.step(); }, device, 10, 3)).median;
  }
  SpeedMlp mlp(8192, 4, 8192, kind, scaling, device, other ? other() : SpeedMlp::Forward());
  result.loss = mlp.fit(kMlpFitSteps, 1e-4);
  return result;
}

// One (m, k, n) matmul's TFLOP/s: bf16 torch::mm against e4m3 _scaled_mm, tensorwise and rowwise
// (your TODO 6; null where refused).
void matmul_row(amplab::ResultTable& table, torch::Device device, int64_t m, int64_t k, int64_t n) {
  torch::NoGradGuard no_grad;
  auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16).device(device);
  torch::Tensor a = torch::randn({m, k}, bf16), b = torch::randn({n, k}, bf16);
  torch::Tensor a8 = a.to(torch::kFloat8_e4m3fn), b8 = b.to(torch::kFloat8_e4m3fn);
  torch::Tensor one = torch::ones({}, torch::TensorOptions().device(device));
  auto tflops = [&](const std::function<void()>& f) {
    for (int i = 0; i < 20; ++i) f();
    return 2.0 * double(m) * double(k) * double(n) / amplab::summarize(amplab::time_back_to_back(f, device, 20, 5)).median / 1e9;
  };
  const double bf16_tflops = tflops([&] { torch::mm(a, b.t()); });
  const double fp8_tflops = tflops([&] { at::_scaled_mm(a8, b8.t(), one, one, {}, {}, torch::kBFloat16); });
  double rowwise = NAN;
  try {  // an (m, 1) and a (1, n) scale
    Fp8Rowwise ar = to_fp8_rowwise(a, Fp8Format::e4m3), br = to_fp8_rowwise(b, Fp8Format::e4m3);
    torch::Tensor inv_a = ar.scale.reciprocal(), inv_b = br.scale.reciprocal().t();
    rowwise = tflops([&] { at::_scaled_mm(ar.data, br.data.t(), inv_a, inv_b, {}, {}, torch::kBFloat16); });
  } catch (const std::exception& e) {
    amplab::log::warn(std::string("rowwise FP8 matmul skipped: ") + e.what());
  }
  table.add({std::to_string(m) + " x " + std::to_string(k) + " x " + std::to_string(n), bf16_tflops, fp8_tflops, rowwise,
             fp8_tflops / bf16_tflops});
}

// The casts' effective bandwidth on an 8192 x 8192 bf16 tensor (bytes read + written per second)
// against the device's copy of it: TODO 3's ATen versions and TODO 7's kernels (null until done).
void cast_table(amplab::Results& results, torch::Device device) {
  torch::NoGradGuard no_grad;
  torch::Tensor x = torch::randn({8192, 8192}, torch::TensorOptions().dtype(torch::kBFloat16).device(device));
  torch::Tensor scale = scale_from_amax(abs_max(x), Fp8Format::e4m3);
  const double n = static_cast<double>(x.numel());
  auto& table = results.table("fp8_casts", {{"name", "8192 x 8192 bf16"}, {"ms", "ms", amplab::decimals(3)},
                                                {"gb_per_s", "GB/s", amplab::decimals(0)}, {"vs_copy", "vs copy", amplab::percent_of_one(0)}});
  double copy_gbs = NAN;
  auto row = [&](const std::string& name, double bytes, const std::function<void()>& work) {
    nlohmann::json ms = nullptr, gbs = nullptr, vs_copy = nullptr;
    try {
      for (int i = 0; i < 3; ++i) work();
      const double t = amplab::summarize(amplab::time_back_to_back(work, device, 20, 3)).median;
      ms = t;
      gbs = bytes / t / 1e6;
      if (std::isnan(copy_gbs)) copy_gbs = bytes / t / 1e6;
      vs_copy = bytes / t / 1e6 / copy_gbs;
    } catch (const amplab::NotImplemented&) {
    }
    table.add({name, ms, gbs, vs_copy});
  };
  row("copy (x.clone())", 4 * n, [&] { x.clone(); });
  row("abs_max (TODO 3)", 2 * n, [&] { abs_max(x); });
  row("abs_max_fast (TODO 7)", 2 * n, [&] { abs_max_fast(x); });
  row("to_fp8 e4m3 (TODO 3)", 3 * n, [&] { to_fp8(x, scale, Fp8Format::e4m3); });
  row("to_fp8_fast e4m3 (TODO 7)", 3 * n, [&] { to_fp8_fast(x, scale, Fp8Format::e4m3); });
  results.print("fp8_casts", "FP8 casts: bytes read + written per second (the minimum: x read once, fp8 written once)");
}

}  // namespace

// The FP8 MLP against bf16, then single matmuls: a large square one, a small one, and the GPT's
// qkv projection (64 x 256 tokens, 384 -> 1152).
void fp8_tables(amplab::Results& results, torch::Device device, const std::function<void(const std::string&)>& phase,
                const OtherMlpRow& other) {
  phase("fp8 mlp");
  // 6 x batch x width^2 per layer (forward, input and weight gradients), less the first layer's
  // input gradient, which is never computed (its input needs none): 22 x batch x width^2 for 4.
  const double flops = (6.0 * 4 - 2) * 8192 * 8192.0 * 8192;
  const MlpResult bf16 = mlp_row(device, LinearKind::plain);
  const MlpResult dynamic = mlp_row(device, LinearKind::fp8, Fp8Scaling::dynamic);
  const MlpResult delayed = mlp_row(device, LinearKind::fp8, Fp8Scaling::delayed);
  auto& table = results.table("fp8_mlp", {{"name", "4 x Linear(8192), batch 8192"}, {"ms_per_step", "ms/step", amplab::decimals(2)},
                                              {"tflops", "TFLOP/s", amplab::decimals(0)}, {"vs_bf16", "vs bf16", amplab::times(2)},
                                              {"fit_loss", "loss after " + std::to_string(kMlpFitSteps) + " steps", amplab::decimals(5)},
                                              {"loss_vs_bf16", "loss vs bf16", amplab::percent_of_one(2)}});
  std::vector<std::pair<std::string, MlpResult>> rows = {
      {"bf16 (autocast)", bf16}, {"fp8 (your fp8_linear, dynamic)", dynamic}, {"fp8 (your fp8_linear, delayed)", delayed}};
  if (!other.name.empty()) rows.emplace_back(other.name, mlp_row(device, LinearKind::plain, Fp8Scaling::dynamic, other.make));
  for (const auto& [name, r] : rows)
    table.add({name, r.ms, flops / r.ms / 1e9, bf16.ms / r.ms, r.loss, r.loss / bf16.loss - 1});
  results.print("fp8_mlp", "FP8 MLP against bf16 (forward + backward; 6 x batch x width^2 FLOP per layer, 4 x for the "
                               "first, whose input gradient is never computed; the loss: Adam towards a fixed random "
                               "target from the same start)");
  phase("fp8 casts");
  cast_table(results, device);
  phase("fp8 matmul");
  auto& matmuls = results.table("fp8_matmul", {{"shape", "m x k x n"}, {"bf16_tflops", "bf16 TFLOP/s", amplab::decimals(0)},
                                                   {"fp8_tflops", "fp8 tensorwise TFLOP/s", amplab::decimals(0)},
                                                   {"fp8_rowwise_tflops", "fp8 rowwise TFLOP/s", amplab::decimals(0)},
                                                   {"tensorwise_vs_bf16", "tensorwise / bf16", amplab::times(2)}});
  matmul_row(matmuls, device, 8192, 8192, 8192);
  matmul_row(matmuls, device, 1024, 2048, 1024);
  matmul_row(matmuls, device, 16384, 384, 1152);
  results.print("fp8_matmul", "One matmul: bf16 against FP8 (_scaled_mm, tensorwise, no cast counted)");
}

}  // namespace transformer_fp8
