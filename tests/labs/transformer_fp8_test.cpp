// Graded tests of lab 7 (transformers in low precision, FP8). Each test names the TODO it grades;
// every one fails on the untouched starter (AMPLAB_TODO throws) and passes on a correct solution.
// They run on the CPU at tiny sizes (torch 2.11 runs the FP8 matmul, at::_scaled_mm, on the CPU
// too, with one scale per tensor); tests named *_CUDA need a GPU (FP8 ones: compute capability
// 8.9 or newer) and are skipped without one.
//
// What they compare with, and why those tolerances:
//  - attention: torch's own scaled_dot_product_attention, in values and gradients;
//  - FP8 scaling: tests/fixtures/fp8_golden.json, PyTorch's amax, scale and saturated casts
//    (made by make_fp8_golden.py with the torch this project links), byte for byte;
//  - the FP8 linear: the matmul of the dequantized operands (what the FP8 matmul computes,
//    up to fp32 summation order), and the plain fp32 linear by signal-to-quantization-noise ratio.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/autocast_mode.h>
#include <ATen/ops/_scaled_mm.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "amplab/measure/timing.hpp"
#include "fp8_kernels.hpp"
#include "gpt.hpp"
#include "support.hpp"
#include "transformer_fp8.hpp"

namespace {
namespace test = amplab::test;
namespace lab = transformer_fp8;
using lab::Fp8Format;

// ---- Helpers ------------------------------------------------------------------------------------

// q, k, v of shape (B, H, T, D), leaves that require gradients, in `dtype`.
struct Qkv {
  torch::Tensor q, k, v;
};
Qkv random_qkv(torch::ScalarType dtype, int64_t B, int64_t H, int64_t T, int64_t D, uint64_t seed) {
  torch::manual_seed(seed);
  auto make = [&] { return torch::randn({B, H, T, D}).to(dtype).requires_grad_(); };
  Qkv t;
  t.q = make();
  t.k = make();
  t.v = make();
  return t;
}
// Detached copies that require gradients of their own: the reference's inputs.
Qkv copy_of(const Qkv& t) {
  return {t.q.detach().clone().requires_grad_(), t.k.detach().clone().requires_grad_(),
          t.v.detach().clone().requires_grad_()};
}

torch::Tensor sdpa(const Qkv& t, const torch::Tensor& mask, double dropout_p, bool causal) {
  return torch::scaled_dot_product_attention(t.q, t.k, t.v, mask.defined() ? std::optional<torch::Tensor>(mask) : std::nullopt,
                                             dropout_p, causal);
}

// Signal-to-quantization-noise ratio in dB: 20 log10(|reference| / |actual - reference|).
double sqnr_db(const torch::Tensor& actual, const torch::Tensor& reference) {
  torch::Tensor ref = reference.to(torch::kFloat64), act = actual.to(torch::kFloat64);
  return 20.0 * std::log10(ref.norm().item<double>() / (act - ref).norm().item<double>());
}

const nlohmann::json& golden() {
  static const nlohmann::json data = test::load_fixture("fp8_golden.json");
  return data;
}
float float_of(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
torch::Tensor scalar_from_bits(const nlohmann::json& bits) { return torch::tensor(float_of(bits.get<uint32_t>())); }
Fp8Format format_of(const nlohmann::json& c) { return c.at("format") == "e4m3" ? Fp8Format::e4m3 : Fp8Format::e5m2; }
torch::Tensor input_of(const nlohmann::json& c) {
  torch::Tensor x = test::tensor_from_bits(c.at("x"));
  return c.at("input_dtype") == "bfloat16" ? x.to(torch::kBFloat16) : x;  // the values are exact in bf16
}

// One-ulp agreement of two 0-dim float32 tensors: fp8_max / amax written as a division or as a
// reciprocal times fp8_max may differ in the last bit; the fixture's casts are made with its own
// scale, so the bytes of the casts do not depend on it.
::testing::AssertionResult within_one_ulp(const torch::Tensor& actual, const torch::Tensor& expected) {
  if (actual.scalar_type() != torch::kFloat32 || actual.dim() != 0)
    return ::testing::AssertionFailure() << "expected a 0-dim float32 tensor, got " << actual.sizes() << " "
                                         << actual.scalar_type();
  float a = actual.item<float>(), e = expected.item<float>();
  if (a == e || std::nextafter(e, a) == a) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << a << ", expected " << e;
}

// A tiny GPT on the committed Hamlet excerpt: `steps` AdamW steps from a fixed seed, no dropout
// (so that two runs can be compared step by step). Returns the losses. Tiny because torch's CPU
// FP8 matmul is a reference kernel (about 1000x slower than an fp32 matmul of the same size),
// and on one thread: two cores shared by CI's jobs make a multi-threaded step 50x slower.
std::vector<double> train_tiny_gpt(lab::AttentionKind attention, lab::LinearKind linear, lab::Fp8Scaling scaling,
                                   int steps, torch::Device device = torch::kCPU,
                                   torch::ScalarType autocast = torch::kFloat32) {
  static const lab::CharData data = lab::CharData::load(test::source_dir() + "/tests/fixtures/shakespeare_tiny.txt");
  torch::set_num_threads(1);
  lab::GptOptions o;
  o.vocab_size = static_cast<int64_t>(data.vocab.size());
  o.block_size = 16;
  o.n_layer = 1;
  o.n_head = 2;
  o.n_embd = 16;
  o.dropout = 0.0;
  o.attention = attention;
  o.linear = linear;
  o.scaling = scaling;
  o.amax_history = 4;
  torch::manual_seed(0);
  lab::Gpt model(o);
  model->to(device);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(3e-3));
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = data.batch(data.train, /*batch=*/4, o.block_size, device);  // 4 x 16 = 64 tokens
    torch::Tensor loss;
    {
      at::autocast::set_autocast_enabled(device.type(), autocast != torch::kFloat32);
      if (autocast != torch::kFloat32) at::autocast::set_autocast_dtype(device.type(), autocast);
      loss = model->loss(x, y);
      at::autocast::set_autocast_enabled(device.type(), false);
      at::autocast::clear_cache();
    }
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

// Whether GPU 0 runs FP8 matmuls (compute capability 8.9 or newer: Ada, Hopper, Blackwell).
bool cuda_supports_fp8() {
  try {
    auto e4m3 = torch::ones({16, 16}, torch::kCUDA).to(torch::kFloat8_e4m3fn);
    auto one = torch::ones({}, torch::kCUDA);
    at::_scaled_mm(e4m3, e4m3.t(), one, one, {}, {}, torch::kFloat32);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// The value of one fp8 byte, for messages.
float fp8_value(const torch::Tensor& byte, Fp8Format format) {
  return byte.reshape({1}).to(torch::kUInt8).view(lab::fp8_dtype(format)).to(torch::kFloat32).item<float>();
}

#define AMPLAB_REQUIRE_FP8_GPU()                                                                        \
  do {                                                                                                   \
    AMPLAB_REQUIRE_CUDA();                                                                               \
    if (!cuda_supports_fp8()) GTEST_SKIP() << "this GPU has no FP8 tensor cores (needs sm_89+)"; \
  } while (0)

// ---- TODO 1: causal attention --------------------------------------------------------------------

// fp32: the same arithmetic as SDPA up to summation order, so 1e-5-level agreement.
TEST(Transformer1_CausalAttention, MatchesSdpaInFp32ValuesAndGradients) {
  Qkv mine = random_qkv(torch::kFloat32, 2, 3, 17, 16, 1), ref = copy_of(mine);
  torch::Tensor out = lab::causal_attention(mine.q, mine.k, mine.v, 0.0, /*training=*/false);
  torch::Tensor expected = sdpa(ref, {}, 0.0, /*causal=*/true);
  ASSERT_TRUE(test::tensors_close(out, expected, 1e-4, 1e-5)) << "the attention's output";
  torch::Tensor grad = torch::randn_like(expected);
  out.backward(grad);
  expected.backward(grad);
  EXPECT_TRUE(test::tensors_close(mine.q.grad(), ref.q.grad(), 1e-4, 1e-5)) << "dL/dq";
  EXPECT_TRUE(test::tensors_close(mine.k.grad(), ref.k.grad(), 1e-4, 1e-5)) << "dL/dk";
  EXPECT_TRUE(test::tensors_close(mine.v.grad(), ref.v.grad(), 1e-4, 1e-5)) << "dL/dv";
}

// bf16 keeps 8 significant bits: each of the scores, the weights and the output is rounded to a
// relative 2^-9 (0.2%), and the errors add up over the keys; 2% covers that, while a wrong mask,
// scale or softmax axis is off by far more.
TEST(Transformer1_CausalAttention, MatchesSdpaInBf16WithinBf16Rounding) {
  Qkv mine = random_qkv(torch::kBFloat16, 2, 2, 16, 32, 2);
  torch::Tensor out = lab::causal_attention(mine.q, mine.k, mine.v, 0.0, false);
  ASSERT_EQ(out.scalar_type(), torch::kBFloat16) << "the output stays in the inputs' dtype";
  Qkv fp32{mine.q.detach().to(torch::kFloat32), mine.k.detach().to(torch::kFloat32), mine.v.detach().to(torch::kFloat32)};
  EXPECT_TRUE(test::tensors_close(out.to(torch::kFloat32), [&] { return sdpa(fp32, {}, 0.0, true); }, 2e-2, 2e-2));
}

// With the same seed, SDPA's math path draws one Bernoulli mask over the (B, H, T, T) weights
// after the softmax: the same call on the same tensor draws the same mask.
TEST(Transformer1_CausalAttention, DropsTheSameWeightsAsPyTorchAndNoneInEval) {
  Qkv t = random_qkv(torch::kFloat32, 2, 2, 12, 8, 3);
  torch::NoGradGuard no_grad;
  torch::manual_seed(42);
  torch::Tensor out = lab::causal_attention(t.q, t.k, t.v, 0.25, /*training=*/true);
  torch::manual_seed(42);
  torch::Tensor expected = sdpa(t, {}, 0.25, true);
  EXPECT_TRUE(test::tensors_close(out, expected, 1e-4, 1e-5)) << "training, dropout 0.25, same seed";
  EXPECT_TRUE(test::tensors_close(lab::causal_attention(t.q, t.k, t.v, 0.25, /*training=*/false),
                                  [&] { return sdpa(t, {}, 0.0, true); }, 1e-4, 1e-5))
      << "eval: no dropout";
}

// The given GPT with your attention trains step for step like the same GPT with torch's SDPA.
TEST(Transformer1_CausalAttention, TinyGptTrainsLikeWithSdpa) {
  auto mine = train_tiny_gpt(lab::AttentionKind::math, lab::LinearKind::plain, lab::Fp8Scaling::dynamic, 5);
  auto ref = train_tiny_gpt(lab::AttentionKind::sdpa, lab::LinearKind::plain, lab::Fp8Scaling::dynamic, 5);
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(mine[i], ref[i], 1e-4) << "loss of step " << i;
}

// ---- TODO 2: attention safe in fp16 ---------------------------------------------------------------

// fp32 with a general mask (every row keeps at least its diagonal): SDPA with a bool mask.
TEST(Transformer2_SafeAttention, MatchesSdpaWithABoolMaskInFp32) {
  Qkv t = random_qkv(torch::kFloat32, 2, 2, 10, 8, 4);
  torch::manual_seed(5);
  torch::Tensor allowed = (torch::rand({2, 1, 10, 10}) > 0.4).logical_or(torch::eye(10, torch::kBool));
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(test::tensors_close(lab::safe_attention(t.q, t.k, t.v, allowed, 0.0, false),
                                  [&] { return sdpa(t, allowed, 0.0, false); }, 1e-4, 1e-5));
}

// fp16 inputs (1, 2, T, 64) on `device`. Head 0: queries of norm 1e5 along one direction u, key s
// = (s + 1)/T u + noise: raw scores reach 1e5 (inf in fp16), scaled ones at most 1e5 / sqrt(64) =
// 12500, neighbouring keys 1e5 / (8T) apart (781 at T = 16), so each query attends to its last
// allowed key with no near tie. Head 1: ordinary scores.
Qkv large_norm_fp16_qkv(int64_t T, torch::Device device) {
  const int64_t D = 64;
  torch::manual_seed(6);
  torch::Tensor u = torch::ones({D}) / std::sqrt(static_cast<double>(D));
  torch::Tensor q = torch::randn({1, 2, T, D}), k = torch::randn({1, 2, T, D}), v = torch::randn({1, 2, T, D});
  q[0][0] = u.expand({T, D}) * 1e5;
  k[0][0] = torch::arange(1, T + 1).unsqueeze(1).to(torch::kFloat32) / T * u + 0.01 * torch::randn({T, D});
  return {q.to(device, torch::kHalf), k.to(device, torch::kHalf), v.to(device, torch::kHalf)};
}

// fp16 keeps 11 significant bits (relative 2^-11 per rounding); 1% covers the scores', weights'
// and output's roundings.
TEST(Transformer2_SafeAttention, LargeNormFp16QueriesStayFiniteAndCloseToFp32) {
  const int64_t T = 16;
  Qkv half = large_norm_fp16_qkv(T, torch::kCPU);
  Qkv exact{half.q.to(torch::kFloat32), half.k.to(torch::kFloat32), half.v.to(torch::kFloat32)};
  ASSERT_GT(torch::matmul(exact.q, exact.k.transpose(-2, -1)).abs().max().item<double>(), 65504.0)
      << "the test's raw scores must overflow fp16";
  torch::Tensor causal = torch::ones({T, T}, torch::kBool).tril();
  torch::Tensor out = lab::safe_attention(half.q, half.k, half.v, causal, 0.0, false);
  ASSERT_EQ(out.scalar_type(), torch::kHalf) << "the output stays in the inputs' dtype";
  ASSERT_TRUE(torch::isfinite(out).all().item<bool>()) << "inf or NaN in the fp16 output: the scores overflowed";
  EXPECT_TRUE(
      test::tensors_close(out.to(torch::kFloat32), [&] { return sdpa(exact, causal, 0.0, false); }, 1e-2, 1e-2));
}

// A query with no allowed key (a padded position, say): -inf everywhere, softmax 0/0 = NaN. Its
// output must be zeros, as SDPA's, and the other rows unharmed.
TEST(Transformer2_SafeAttention, AFullyMaskedRowGivesZerosNotNaN) {
  Qkv t = random_qkv(torch::kHalf, 2, 2, 8, 16, 7);
  torch::Tensor allowed = torch::ones({8, 8}, torch::kBool).tril().expand({2, 2, 8, 8}).clone();
  allowed.index_put_({1, torch::indexing::Slice(), 3}, false);  // batch 1, query 3: nothing allowed
  torch::NoGradGuard no_grad;
  torch::Tensor out = lab::safe_attention(t.q, t.k, t.v, allowed, 0.0, false);
  ASSERT_TRUE(torch::isfinite(out).all().item<bool>()) << "a fully masked row gave inf or NaN";
  EXPECT_EQ(out.index({1, torch::indexing::Slice(), 3}).abs().max().item<double>(), 0.0) << "the fully masked row";
  Qkv exact{t.q.to(torch::kFloat32), t.k.to(torch::kFloat32), t.v.to(torch::kFloat32)};
  EXPECT_TRUE(
      test::tensors_close(out.to(torch::kFloat32), [&] { return sdpa(exact, allowed, 0.0, false); }, 1e-2, 1e-2));
}

TEST(Transformer2_SafeAttention, TinyGptTrainsLikeWithSdpa) {
  auto mine = train_tiny_gpt(lab::AttentionKind::safe, lab::LinearKind::plain, lab::Fp8Scaling::dynamic, 5);
  auto ref = train_tiny_gpt(lab::AttentionKind::sdpa, lab::LinearKind::plain, lab::Fp8Scaling::dynamic, 5);
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(mine[i], ref[i], 1e-4) << "loss of step " << i;
}

// ---- TODO 3: FP8 scaling, against PyTorch to the bit ------------------------------------------------

TEST(Transformer3_Fp8Scaling, AmaxIsTheLargestMagnitudeToTheBit) {
  for (const auto& c : golden().at("cases")) {
    SCOPED_TRACE("fixture case " + c.at("name").get<std::string>());
    torch::Tensor a = lab::abs_max(input_of(c));
    ASSERT_EQ(a.scalar_type(), torch::kFloat32);
    ASSERT_EQ(a.dim(), 0);
    EXPECT_TRUE(test::tensors_equal(a, scalar_from_bits(c.at("amax"))));
  }
}

TEST(Transformer3_Fp8Scaling, ScaleMapsAmaxOntoTheFormatsLargestValue) {
  for (const auto& c : golden().at("cases")) {
    SCOPED_TRACE("fixture case " + c.at("name").get<std::string>() + " (an all-zero tensor: amax floored at 1e-12)");
    EXPECT_TRUE(within_one_ulp(lab::scale_from_amax(scalar_from_bits(c.at("amax")), format_of(c)),
                               scalar_from_bits(c.at("scale"))));
  }
}

// Normal values, outliers, an all-zero tensor, a bf16 input, exact ties (round half to even),
// subnormals, and stale scales that push values past the format's largest (saturation).
TEST(Transformer3_Fp8Scaling, SaturatedCastsMatchPyTorchBitForBit) {
  for (const auto& c : golden().at("cases")) {
    SCOPED_TRACE("fixture case " + c.at("name").get<std::string>());
    Fp8Format format = format_of(c);
    torch::Tensor data = lab::to_fp8(input_of(c), scalar_from_bits(c.at("cast_scale")), format);
    ASSERT_EQ(data.scalar_type(), lab::fp8_dtype(format));
    std::vector<int64_t> bytes = c.at("data").get<std::vector<int64_t>>();
    torch::Tensor expected = torch::tensor(bytes, torch::kInt64).to(torch::kUInt8);
    torch::Tensor actual = data.contiguous().view(torch::kUInt8).reshape({-1});
    ASSERT_EQ(actual.numel(), expected.numel());
    torch::Tensor differ = (actual != expected).nonzero();
    if (differ.numel() > 0) {
      int64_t i = differ[0][0].item<int64_t>();
      FAIL() << differ.size(0) << " of " << expected.numel() << " bytes differ; first at element " << i << ": x = "
             << input_of(c).reshape({-1})[i].item<float>() << ", got " << data.reshape({-1})[i].to(torch::kFloat32).item<float>()
             << ", PyTorch " << fp8_value(expected[i], format) << " (a NaN or inf: the cast did not saturate)";
    }
  }
}

// ---- TODO 6 (stretch): rowwise scaling ---------------------------------------------------------------

// Each row's scale against PyTorch's, within one ulp (see within_one_ulp).
TEST(Transformer6_Rowwise, ScalesEachRowByItsOwnAmax) {
  for (const auto& c : golden().at("rowwise_cases")) {
    SCOPED_TRACE("fixture case " + c.at("name").get<std::string>() + " (row 3: an outlier row, row 5: all zeros)");
    torch::Tensor x = input_of(c);
    lab::Fp8Rowwise cast = lab::to_fp8_rowwise(x, format_of(c));
    torch::Tensor expected = test::tensor_from_bits(c.at("scale"));
    ASSERT_EQ(cast.scale.scalar_type(), torch::kFloat32);
    ASSERT_EQ(cast.scale.sizes(), expected.sizes()) << "one scale per row, as an (N, 1) column";
    for (int64_t i = 0; i < x.size(0); ++i)
      ASSERT_TRUE(within_one_ulp(cast.scale[i][0], expected[i][0])) << "row " << i;
  }
}

// The bytes of each row whose scale is PyTorch's to the bit (a scale one ulp off may move a tie).
TEST(Transformer6_Rowwise, CastsEachRowLikePyTorch) {
  for (const auto& c : golden().at("rowwise_cases")) {
    SCOPED_TRACE("fixture case " + c.at("name").get<std::string>());
    torch::Tensor x = input_of(c);
    Fp8Format format = format_of(c);
    lab::Fp8Rowwise cast = lab::to_fp8_rowwise(x, format);
    ASSERT_EQ(cast.data.scalar_type(), lab::fp8_dtype(format));
    ASSERT_EQ(cast.data.sizes(), x.sizes());
    ASSERT_EQ(cast.scale.sizes(), (std::vector<int64_t>{x.size(0), 1})) << "one scale per row, as an (N, 1) column";
    torch::Tensor expected = torch::tensor(c.at("data").get<std::vector<int64_t>>(), torch::kInt64).to(torch::kUInt8).view(x.sizes());
    torch::Tensor actual = cast.data.contiguous().view(torch::kUInt8);
    torch::Tensor scales = test::tensor_from_bits(c.at("scale"));
    int64_t checked = 0;
    for (int64_t i = 0; i < x.size(0); ++i) {
      if (!torch::equal(cast.scale[i], scales[i])) continue;
      ++checked;
      torch::Tensor differ = (actual[i] != expected[i]).nonzero();
      if (differ.numel() > 0) {
        int64_t j = differ[0][0].item<int64_t>();
        FAIL() << "row " << i << ", element " << j << ": x = " << x[i][j].item<float>() << ", got "
               << cast.data[i][j].to(torch::kFloat32).item<float>() << ", PyTorch " << fp8_value(expected[i][j], format);
      }
    }
    EXPECT_GT(checked, x.size(0) / 2) << "most rows' scales must be PyTorch's to the bit";
  }
}

// ---- TODO 4: the FP8 linear layer -------------------------------------------------------------------

struct LinearCase {
  torch::Tensor x, w, x_scale, w_scale;
};
LinearCase linear_case(uint64_t seed, torch::ScalarType x_dtype = torch::kFloat32) {
  torch::manual_seed(seed);
  LinearCase c;
  c.x = torch::randn({64, 96}).to(x_dtype).requires_grad_();  // (N, in)
  c.w = (torch::randn({48, 96}) * 0.05).requires_grad_();      // (out, in)
  c.x_scale = lab::scale_from_amax(lab::abs_max(c.x.detach()), Fp8Format::e4m3);
  c.w_scale = lab::scale_from_amax(lab::abs_max(c.w.detach()), Fp8Format::e4m3);
  return c;
}
torch::Tensor dequantized(const torch::Tensor& t, const torch::Tensor& scale, Fp8Format format) {
  return lab::from_fp8(lab::to_fp8(t.detach(), scale, format), scale);
}

// e4m3 keeps 4 significant bits: one operand's rounding noise is about 31 dB below it, and the
// product of two, summed over 96 terms, measured 28.5 dB; 25 dB leaves room for other seeds
// while a wrong scale (scale instead of 1/scale: off by 448^2-fold) or layout is far below 0 dB.
TEST(Transformer4_Fp8Linear, ForwardIsTheMatmulOfTheDequantizedOperands) {
  LinearCase c = linear_case(10);
  torch::Tensor y = lab::fp8_linear(c.x, c.w, c.x_scale, c.w_scale);
  ASSERT_EQ(y.scalar_type(), torch::kFloat32);
  ASSERT_EQ(y.sizes(), (std::vector<int64_t>{64, 48}));
  torch::Tensor expected = torch::matmul(dequantized(c.x, c.x_scale, Fp8Format::e4m3),
                                         dequantized(c.w, c.w_scale, Fp8Format::e4m3).t());
  EXPECT_TRUE(test::tensors_close(y.detach(), expected, 1e-5, 1e-5)) << "against the matmul of the dequantized e4m3 operands";
  double db = sqnr_db(y.detach(), torch::matmul(c.x.detach(), c.w.detach().t()));
  EXPECT_GE(db, 25.0) << "SQNR against the fp32 linear";
}

// dL/dx and dL/dw of y = x w^T for dL/dy = dy, from autograd itself: the tests state no formula
// (deriving it is the student's part).
std::pair<torch::Tensor, torch::Tensor> autograd_gradients(const torch::Tensor& x, const torch::Tensor& w,
                                                           const torch::Tensor& dy) {
  torch::Tensor xr = x.detach().clone().requires_grad_(), wr = w.detach().clone().requires_grad_();
  torch::matmul(xr, wr.t()).backward(dy);
  return {xr.grad(), wr.grad()};
}

// e5m2 keeps 3 significant bits: the gradients measured 24.6 dB against fp32's; 20 dB is the
// threshold. Each gradient must also be the matmul of the dequantized e5m2 gradient and the
// saved e4m3 operand (the backward reuses forward's casts, and casts the gradient itself).
TEST(Transformer4_Fp8Linear, BackwardUsesE5m2GradientsAndMatchesThePlainLinear) {
  LinearCase c = linear_case(11);
  torch::Tensor y = lab::fp8_linear(c.x, c.w, c.x_scale, c.w_scale);
  torch::Tensor g = torch::randn({64, 48}) * 1e-3;  // dL/dy, small as gradients are
  y.backward(g);
  ASSERT_TRUE(c.x.grad().defined() && c.w.grad().defined()) << "backward must return dL/dx and dL/dw";
  ASSERT_EQ(c.w.grad().scalar_type(), torch::kFloat32);
  torch::Tensor g_scale = lab::scale_from_amax(lab::abs_max(g), Fp8Format::e5m2);
  torch::Tensor g8 = dequantized(g, g_scale, Fp8Format::e5m2);
  torch::Tensor x8 = dequantized(c.x, c.x_scale, Fp8Format::e4m3), w8 = dequantized(c.w, c.w_scale, Fp8Format::e4m3);
  // fp32 sums of 48 or 64 products in another order: errors of 1e-6 of the largest value.
  auto [dx, dw] = autograd_gradients(x8, w8, g8);
  EXPECT_TRUE(test::tensors_close(c.x.grad(), dx, 1e-5, 1e-6 * dx.abs().max().item<double>()))
      << "dL/dx against autograd through x w^T, on the dequantized e4m3 operands and e5m2 gradient";
  EXPECT_TRUE(test::tensors_close(c.w.grad(), dw, 1e-5, 1e-6 * dw.abs().max().item<double>()))
      << "dL/dw against autograd through x w^T, on the dequantized e4m3 operands and e5m2 gradient";
  auto [dx32, dw32] = autograd_gradients(c.x, c.w, g);
  EXPECT_GE(sqnr_db(c.x.grad(), dx32), 20.0) << "dL/dx against the fp32 linear's";
  EXPECT_GE(sqnr_db(c.w.grad(), dw32), 20.0) << "dL/dw against the fp32 linear's";
}

// The FP8 matmuls (aten::_scaled_mm, seen by a RecordFunction observer on any thread) that run
// while `work` does.
std::atomic<int> scaled_matmuls{0};
int scaled_matmuls_during(const std::function<void()>& work) {
  scaled_matmuls = 0;
  auto handle = at::addGlobalCallback(at::RecordFunctionCallback([](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
                                        if (std::string_view(fn.name()) == "aten::_scaled_mm") ++scaled_matmuls;
                                        return nullptr;
                                      }).needsInputs(false));
  work();
  at::removeCallback(handle);
  return scaled_matmuls.load();
}

// A network's first layer gets an input that needs no gradient (the data): its dL/dx would cost
// an FP8 matmul as large as the others and be thrown away. Backward computes what autograd asks
// for: one matmul (dL/dw) there, two when the input needs its gradient too.
TEST(Transformer4_Fp8Linear, BackwardComputesOnlyTheGradientsAutogradAsksFor) {
  LinearCase c = linear_case(13);
  const torch::Tensor data = c.x.detach();  // an input without a gradient
  torch::Tensor y = lab::fp8_linear(data, c.w, c.x_scale, c.w_scale);
  EXPECT_EQ(scaled_matmuls_during([&] { y.sum().backward(); }), 1)
      << "FP8 matmuls in backward for an input that needs no gradient: dL/dw only (ctx->needs_input_grad)";
  ASSERT_TRUE(c.w.grad().defined()) << "the weight still gets its gradient";
  torch::Tensor ones = torch::ones({64, 48});
  torch::Tensor g8 = dequantized(ones, lab::scale_from_amax(lab::abs_max(ones), Fp8Format::e5m2), Fp8Format::e5m2);
  torch::Tensor dw = autograd_gradients(dequantized(data, c.x_scale, Fp8Format::e4m3),
                                        dequantized(c.w, c.w_scale, Fp8Format::e4m3), g8).second;
  EXPECT_TRUE(test::tensors_close(c.w.grad(), dw, 1e-5, 1e-6 * dw.abs().max().item<double>()))
      << "dL/dw against autograd through x w^T";

  LinearCase both = linear_case(13);
  torch::Tensor y2 = lab::fp8_linear(both.x, both.w, both.x_scale, both.w_scale);
  EXPECT_EQ(scaled_matmuls_during([&] { y2.sum().backward(); }), 2) << "dL/dx and dL/dw when both are asked for";
}

TEST(Transformer4_Fp8Linear, Bf16InputsGiveBf16OutputsAndFp32WeightGradients) {
  LinearCase c = linear_case(12, torch::kBFloat16);
  torch::Tensor y = lab::fp8_linear(c.x, c.w, c.x_scale, c.w_scale);
  ASSERT_EQ(y.scalar_type(), torch::kBFloat16) << "the output in the input's dtype";
  y.sum().backward();
  ASSERT_EQ(c.x.grad().scalar_type(), torch::kBFloat16);
  ASSERT_EQ(c.w.grad().scalar_type(), torch::kFloat32) << "the master weight's gradient stays fp32";
  EXPECT_GE(sqnr_db(y.detach(), torch::matmul(c.x.detach().to(torch::kFloat32), c.w.detach().t())), 25.0);
}

// The given GPT with every block's linear layers in FP8 (dynamic scaling) learns the text about
// as well as in fp32 over a few steps: within 0.15 nats after 30 steps.
TEST(Transformer4_Fp8Linear, TinyGptLearnsWithFp8Linears) {
  auto fp8 = train_tiny_gpt(lab::AttentionKind::sdpa, lab::LinearKind::fp8, lab::Fp8Scaling::dynamic, 30);
  auto fp32 = train_tiny_gpt(lab::AttentionKind::sdpa, lab::LinearKind::plain, lab::Fp8Scaling::dynamic, 30);
  EXPECT_LT(fp8.back(), fp8.front() - 0.5) << "the FP8 model did not learn";
  EXPECT_NEAR(fp8.back(), fp32.back(), 0.15) << "FP8 against fp32 after 30 steps";
}

// ---- TODO 5: delayed scaling --------------------------------------------------------------------

torch::Tensor expected_scale(double fp8_max, double largest) {
  return torch::full({}, fp8_max, torch::kFloat32) / torch::full({}, largest, torch::kFloat32);
}

TEST(Transformer5_DelayedScaling, ScaleComesFromTheLargestAmaxOfTheLastNSteps) {
  lab::AmaxHistory history(4, Fp8Format::e4m3);
  EXPECT_TRUE(within_one_ulp(history.scale(), torch::tensor(1.0f))) << "nothing recorded yet: scale 1";
  const std::vector<float> amaxes = {1.0f, 8.0f, 2.0f, 3.0f, 0.5f, 0.25f, 0.1f, 6.0f};
  for (size_t i = 0; i < amaxes.size(); ++i) {
    history.record(torch::tensor(amaxes[i]));
    float largest = 0;
    for (size_t j = i >= 3 ? i - 3 : 0; j <= i; ++j) largest = std::max(largest, amaxes[j]);
    EXPECT_TRUE(within_one_ulp(history.scale(), expected_scale(448.0, largest)))
        << "after recording " << i + 1 << " amaxes (the last 4 count; largest " << largest << ")";
  }
  lab::AmaxHistory grads(2, Fp8Format::e5m2);
  grads.record(torch::tensor(1e-3f));
  EXPECT_TRUE(within_one_ulp(grads.scale(), expected_scale(57344.0, 1e-3f))) << "e5m2";
}

// Saved after the ring wrapped once: the next record must overwrite the oldest amax (100, at
// slot 1), whatever history object it lands in.
TEST(Transformer5_DelayedScaling, StateRoundTripContinuesExactly) {
  lab::AmaxHistory history(3, Fp8Format::e4m3);
  for (float a : {1.0f, 100.0f, 2.0f, 3.0f}) history.record(torch::tensor(a));  // slots: 3, 100, 2; next = 1
  lab::AmaxHistory::State saved = history.state();
  history.record(torch::tensor(50.0f));  // the saved state is a copy: unchanged by this
  lab::AmaxHistory restored(3, Fp8Format::e4m3);
  restored.load_state(saved);
  EXPECT_TRUE(within_one_ulp(restored.scale(), expected_scale(448.0, 100.0f))) << "right after loading";
  restored.record(torch::tensor(4.0f));  // overwrites 100: the ring is 3, 4, 2
  EXPECT_TRUE(within_one_ulp(restored.scale(), expected_scale(448.0, 4.0f)))
      << "the restored history must overwrite the oldest amax next (save the slot it writes next)";
  EXPECT_TRUE(test::throws_with([] { lab::AmaxHistory(5, Fp8Format::e4m3).load_state(lab::AmaxHistory(3, Fp8Format::e4m3).state()); },
                                {"length"}))
      << "a state of another length";
}

TEST(Transformer5_DelayedScaling, TinyGptLearnsWithDelayedScaling) {
  auto delayed = train_tiny_gpt(lab::AttentionKind::sdpa, lab::LinearKind::fp8, lab::Fp8Scaling::delayed, 30);
  auto fp32 = train_tiny_gpt(lab::AttentionKind::sdpa, lab::LinearKind::plain, lab::Fp8Scaling::dynamic, 30);
  EXPECT_LT(delayed.back(), delayed.front() - 0.5) << "the model with delayed scaling did not learn";
  EXPECT_NEAR(delayed.back(), fp32.back(), 0.15) << "delayed FP8 against fp32 after 30 steps";
}

// ---- On a GPU ---------------------------------------------------------------------------------------

// cuBLAS's FP8 matmul against the CPU's on the same fp8 operands. The products are exact in both,
// but Hopper's FP8 tensor cores keep fewer bits than fp32 in their running sums, so the error
// follows the size of the sums, not of each result: measured on an H100, up to 4.3e-4 apart where
// the outputs reach about 0.4 (1.1e-3 of the largest), small outputs included. So the two are
// compared at 5e-3 relative plus 2e-3 of the largest output: a wrong scale or layout is off by far
// more. A GPU also enforces what the CPU lets pass: the second operand column-major, e5m2 x e5m2
// refused.
TEST(TransformerGpu, Fp8LinearOnTheGpuMatchesTheCpu_CUDA) {
  AMPLAB_REQUIRE_FP8_GPU();
  torch::Device gpu(torch::kCUDA, 0);
  LinearCase cpu = linear_case(20);
  torch::Tensor xg = cpu.x.detach().to(gpu).requires_grad_(), wg = cpu.w.detach().to(gpu).requires_grad_();
  torch::Tensor y_cpu = lab::fp8_linear(cpu.x, cpu.w, cpu.x_scale, cpu.w_scale);
  torch::Tensor y_gpu = lab::fp8_linear(xg, wg, cpu.x_scale.to(gpu), cpu.w_scale.to(gpu));
  EXPECT_TRUE(test::tensors_close(y_gpu.detach().cpu(), y_cpu.detach(), 5e-3,
                                  2e-3 * y_cpu.detach().abs().max().item<double>()))
      << "forward";
  torch::Tensor g = torch::randn({64, 48}) * 1e-3;
  y_cpu.backward(g);
  y_gpu.backward(g.to(gpu));
  EXPECT_TRUE(test::tensors_close(xg.grad().cpu(), cpu.x.grad(), 5e-3, 2e-3 * cpu.x.grad().abs().max().item<double>()))
      << "dL/dx";
  EXPECT_TRUE(test::tensors_close(wg.grad().cpu(), cpu.w.grad(), 5e-3, 2e-3 * cpu.w.grad().abs().max().item<double>()))
      << "dL/dw";
}

// cuBLAS's rowwise FP8 matmul (an (N, 1) scale for the first operand, (1, M) for the second,
// bf16 out) with your casts equals the matmul of the dequantized operands, up to bf16's rounding
// of the output (8 significant bits: 1%).
TEST(TransformerGpu, RowwiseScaledMatmulMatchesTheDequantizedOne_CUDA) {
  AMPLAB_REQUIRE_FP8_GPU();
  torch::Device gpu(torch::kCUDA, 0);
  torch::manual_seed(22);
  torch::Tensor a = torch::randn({64, 96}, gpu), b = torch::randn({48, 96}, gpu);
  a[3] *= 100;  // an outlier row
  lab::Fp8Rowwise a8 = lab::to_fp8_rowwise(a, Fp8Format::e4m3), b8 = lab::to_fp8_rowwise(b, Fp8Format::e4m3);
  torch::Tensor y = at::_scaled_mm(a8.data, b8.data.t(), a8.scale.reciprocal(), b8.scale.reciprocal().t(), {}, {},
                                   torch::kBFloat16);
  torch::Tensor expected = torch::matmul(a8.data.to(torch::kFloat32) / a8.scale, (b8.data.to(torch::kFloat32) / b8.scale).t());
  EXPECT_TRUE(test::tensors_close(y.to(torch::kFloat32).cpu(), expected.cpu(), 1e-2, 1e-2 * expected.abs().max().item<double>()));
}

// The inputs of the CPU test on the GPU (cuBLAS's fp16 matmuls), with a fully masked row.
TEST(TransformerGpu, SafeAttentionInFp16OnTheGpu_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  torch::Device gpu(torch::kCUDA, 0);
  const int64_t T = 32;
  Qkv half = large_norm_fp16_qkv(T, gpu);
  torch::NoGradGuard no_grad;
  torch::Tensor allowed = torch::ones({T, T}, torch::dtype(torch::kBool).device(gpu)).tril().expand({1, 2, T, T}).clone();
  allowed.index_put_({0, 1, 5}, false);  // head 1, query 5: nothing allowed
  torch::Tensor out = lab::safe_attention(half.q, half.k, half.v, allowed, 0.0, false);
  ASSERT_TRUE(torch::isfinite(out).all().item<bool>()) << "inf or NaN in the fp16 output";
  // The reference on the CPU: its SDPA gives a fully masked row zeros (the math path's safe softmax).
  Qkv exact{half.q.cpu().to(torch::kFloat32), half.k.cpu().to(torch::kFloat32), half.v.cpu().to(torch::kFloat32)};
  EXPECT_TRUE(test::tensors_close(out.to(torch::kFloat32).cpu(), [&] { return sdpa(exact, allowed.cpu(), 0.0, false); },
                                  1e-2, 1e-2));
}

TEST(TransformerGpu, GptTrainsInBf16WithFp8Linears_CUDA) {
  AMPLAB_REQUIRE_FP8_GPU();
  torch::Device gpu(torch::kCUDA, 0);
  auto fp8 = train_tiny_gpt(lab::AttentionKind::sdpa, lab::LinearKind::fp8, lab::Fp8Scaling::dynamic, 30, gpu,
                            torch::kBFloat16);
  auto bf16 = train_tiny_gpt(lab::AttentionKind::sdpa, lab::LinearKind::plain, lab::Fp8Scaling::dynamic, 30, gpu,
                             torch::kBFloat16);
  EXPECT_LT(fp8.back(), fp8.front() - 0.5) << "the FP8 model did not learn";
  EXPECT_NEAR(fp8.back(), bf16.back(), 0.2) << "FP8 against bf16 after 30 steps";
}

// ---- TODO 7, the stretch: casts that cost one pass ---------------------------------------------

// fn throws an amplab::Error whose message holds every one of `parts`.
::testing::AssertionResult rejects(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const amplab::Error& e) {
    const std::string message = e.what();
    for (const std::string& part : parts)
      if (message.find(part) == std::string::npos)
        return ::testing::AssertionFailure() << "the error \"" << message << "\" does not mention \"" << part << "\"";
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no amplab::Error";
}

TEST(Transformer7_FastCasts, BadCountsAreErrorsAndEmptyLaunchesNothing) {
  EXPECT_TRUE(rejects([] { lab::abs_max_launch(nullptr, lab::CastInput::bf16, -1, nullptr, nullptr); },
                      {"abs_max_launch", "n = -1"}));
  EXPECT_TRUE(rejects([] { lab::to_fp8_launch(nullptr, lab::CastInput::f32, -3, nullptr, false, nullptr, nullptr); },
                      {"to_fp8_launch", "n = -3"}));
  EXPECT_TRUE(rejects([] { lab::to_fp8_transposed_launch(nullptr, lab::CastInput::bf16, -16, 32, nullptr, false, nullptr,
                                                         nullptr, nullptr); },
                      {"to_fp8_transposed_launch", "rows = -16"}));
  EXPECT_TRUE(rejects([] { lab::to_fp8_transposed_launch(nullptr, lab::CastInput::bf16, 32, 24, nullptr, false, nullptr,
                                                         nullptr, nullptr); },
                      {"to_fp8_transposed_launch", "cols = 24", "16"}));
  lab::abs_max_launch(nullptr, lab::CastInput::bf16, 0, nullptr, nullptr);  // empty: no launch, no GPU needed
  lab::to_fp8_launch(nullptr, lab::CastInput::f16, 0, nullptr, true, nullptr, nullptr);
  lab::to_fp8_transposed_launch(nullptr, lab::CastInput::f32, 0, 64, nullptr, false, nullptr, nullptr, nullptr);
}

// The kernels against TODO 3's functions, byte for byte: float32, bf16 and fp16; sizes below one
// 16-byte pack, with and without a tail; a view that starts one element past 16-byte alignment;
// scales that saturate part of the tensor in both formats; the transposing cast on whole and edge
// tiles; and a NaN, which amax must keep.
TEST(Transformer7_FastCasts, MatchTheTensorCastsBitForBit_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  torch::Device gpu(torch::kCUDA, 0);
  torch::manual_seed(23);
  auto bytes = [](const torch::Tensor& t) { return t.contiguous().view(torch::kUInt8); };
  for (torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16})
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{4099}, int64_t{(1 << 20) + 3}}) {
      torch::Tensor storage = (torch::randn({n + 1}, gpu) * 1e4).to(dtype);
      for (int64_t offset : {0, 1}) {
        torch::Tensor x = storage.narrow(0, offset, n);
        const std::string where = std::string(c10::toString(dtype)) + ", n = " + std::to_string(n) +
                                  ", offset " + std::to_string(offset);
        ASSERT_TRUE(torch::equal(lab::abs_max_fast(x), lab::abs_max(x))) << "amax, " << where;
        for (Fp8Format format : {Fp8Format::e4m3, Fp8Format::e5m2}) {
          torch::Tensor scale = lab::scale_from_amax(lab::abs_max(x), format) * 4;  // the top 3/4 saturates
          ASSERT_TRUE(torch::equal(bytes(lab::to_fp8_fast(x, scale, format)), bytes(lab::to_fp8(x, scale, format))))
              << (format == Fp8Format::e4m3 ? "e4m3, " : "e5m2, ") << where;
        }
      }
    }
  // The transposing cast: whole 64 x 64 tiles, edge tiles in both directions, one tile smaller
  // than 64 x 64, and a matrix taller than wide.
  for (torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16})
    for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{64, 64}, {80, 48}, {16, 16}, {1040, 272}, {256, 2064}}) {
      torch::Tensor x = (torch::randn({rows, cols}, gpu) * 1e4).to(dtype);
      const std::string where = std::string(c10::toString(dtype)) + ", " + std::to_string(rows) + " x " + std::to_string(cols);
      for (Fp8Format format : {Fp8Format::e4m3, Fp8Format::e5m2}) {
        torch::Tensor scale = lab::scale_from_amax(lab::abs_max(x), format) * 4;
        torch::Tensor reference = bytes(lab::to_fp8(x, scale, format));
        lab::Fp8WithTranspose both = lab::to_fp8_transposed_fast(x, scale, format);
        ASSERT_EQ(both.transposed.sizes(), torch::IntArrayRef({cols, rows})) << where;
        ASSERT_TRUE(torch::equal(bytes(both.data), reference)) << "the row-major cast, " << where;
        ASSERT_TRUE(torch::equal(bytes(both.transposed), reference.t())) << "the transpose, " << where;
      }
    }
  torch::Tensor with_nan = torch::randn({4099}, gpu).to(torch::kBFloat16);
  with_nan[4000] = std::nan("");
  EXPECT_TRUE(std::isnan(lab::abs_max_fast(with_nan).item<float>())) << "a NaN must win the max, as in torch";
}

// The stretch's speed: a step of the lab's FP8 MLP (4 x Linear(8192), batch 8192, dynamic
// scaling: your casts, kernels and FP8 linear) against the same MLP on torch's bf16 linears. The
// reference solution's speed-up on an H200 (700 W, 1980 MHz; measured 2026-11-24: 1.57x and 1.58x
// in the lab's table, 1.57x in this test; update it from labs/transformer_fp8/gpu-check.sh's output);
// full points at 5/6 of it, proportionally less below. It never fails for speed.
constexpr double kReferenceFp8MlpSpeedup = 1.57;

TEST(TransformerGpu, Fp8MlpSpeed_CUDA) {
  AMPLAB_REQUIRE_FP8_GPU();
  torch::Device gpu(torch::kCUDA, 0);
  auto step_ms = [&](lab::LinearKind kind) {
    lab::SpeedMlp mlp(8192, 4, 8192, kind, lab::Fp8Scaling::dynamic, gpu);
    for (int i = 0; i < 3; ++i) mlp.step();
    return amplab::quantile(amplab::time_back_to_back([&] { mlp.step(); }, gpu, 10, 3), 0.5);
  };
  {  // For the grader: FP8 steps on fresh inputs, each step's four weight gradients checked.
    lab::SpeedMlp mlp(8192, 4, 8192, lab::LinearKind::fp8, lab::Fp8Scaling::dynamic, gpu);
    if (amplab::test::make_speed_calls_for_the_grader({420, [&](int) { mlp.input().normal_(); }, [&] {
                                                         mlp.step();
                                                         return mlp.gradients();
                                                       }, 1e-3}))
      return;
  }
  const double bf16_ms = step_ms(lab::LinearKind::plain), fp8_ms = step_ms(lab::LinearKind::fp8);
  ASSERT_TRUE(std::isfinite(fp8_ms) && fp8_ms > 0);
  const double ratio = bf16_ms / fp8_ms;
  const double fraction = std::clamp(ratio / (kReferenceFp8MlpSpeedup * 5.0 / 6.0), 0.0, 1.0);
  ::testing::Test::RecordProperty("speed_ratio", std::to_string(ratio));
  ::testing::Test::RecordProperty("points_fraction", std::to_string(fraction));
  std::cout << "bf16 " << bf16_ms << " ms, fp8 " << fp8_ms << " ms: speed-up " << ratio << " (reference "
            << kReferenceFp8MlpSpeedup << "): " << std::lround(100 * fraction) << "% of the points\n";
}

}  // namespace
