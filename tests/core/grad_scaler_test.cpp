// The C++ GradScaler against PyTorch's: a recorded Python run replayed step by step (scale
// trajectory, skip pattern, final parameters to the last bit), plus its API contract.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "amplab/fused_adamw.hpp"
#include "amplab/fused_sgd.hpp"
#include "amplab/grad_clip.hpp"
#include "amplab/grad_scaler.hpp"
#include "amplab/precision.hpp"
#include "support.hpp"

namespace amplab {
namespace {


// The same model as the Python script: Linear(8,16) -> ReLU -> Linear(16,4).
struct Mlp : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  Mlp() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
};

// The golden tests (here and in optimizer_test.cpp) replay fixtures recorded by PyTorch to the
// last bit. Both sides pin the CPU kernels: ATen's scalar ones and MKL's SSE2 path (conditional
// bitwise reproducibility), as tests/fixtures/make_*_golden.py do, so that the bits do not depend
// on the machine's vector units (AVX2 and AVX-512 kernels sum in other orders). Set before main(),
// before any torch op or MKL call reads them, for the whole core_test process.
const bool kCpuKernelsPinned = [] {
  setenv("ATEN_CPU_CAPABILITY", "default", /*overwrite=*/1);
  setenv("MKL_CBWR", "COMPATIBLE", 1);
  return true;
}();

class GradScalerGolden : public ::testing::TestWithParam<int> {};

// Bitwise in fp32: both sides run the same kernels from the same libtorch on one thread, so every
// operation happens in the same order.
TEST_P(GradScalerGolden, ReplaysPyTorchToTheLastBit) {
  torch::set_num_threads(1);
  auto golden = test::load_fixture("grad_scaler_golden.json");
  const auto& s = golden.at("scenarios").at(GetParam());
  SCOPED_TRACE(s.at("name").get<std::string>());

  auto model = std::make_shared<Mlp>();
  auto params = model->parameters();
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(test::tensor_from_bits(s.at("initial_params")[i]));
  }
  torch::Tensor xs = test::tensor_from_bits(s.at("x")), ys = test::tensor_from_bits(s.at("y"));
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(0.05).momentum(0.9));
  GradScalerConfig config;
  config.init_scale = s.at("init_scale").get<double>();
  config.growth_interval = s.at("growth_interval").get<int64_t>();
  GradScaler scaler(config);
  const double loss_multiplier = s.at("loss_multiplier").get<double>();
  const bool clip = !s.at("clip_norm").is_null();

  for (int64_t step = 0; step < s.at("steps").get<int64_t>(); ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const auto& expected = s.at("trace")[step];
    optimizer.zero_grad(/*set_to_none=*/true);
    torch::Tensor loss = torch::mse_loss(model->forward(xs[step]), ys[step]) * loss_multiplier;
    EXPECT_EQ(scaler.get_scale(), expected.at("scale_before").get<double>());
    scaler.scale(loss).backward();
    if (auto it = s.at("injections").find(std::to_string(step)); it != s.at("injections").end()) {
      std::string kind = (*it)[0];
      double value = kind == "nan" ? NAN : (kind == "inf" ? INFINITY : -INFINITY);
      torch::NoGradGuard no_grad;
      params[(*it)[1].get<size_t>()].grad().view(-1)[(*it)[2].get<int64_t>()] = value;
    }
    if (clip) {
      scaler.unscale_(optimizer);
      clip_grad_norm_(params, s.at("clip_norm").get<double>());
    }
    bool stepped = scaler.step(optimizer);
    EXPECT_EQ(stepped, expected.at("stepped").get<bool>());
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), expected.at("scale_after").get<double>());
    EXPECT_EQ(scaler.growth_tracker(), expected.at("growth_tracker").get<int64_t>());
  }
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(test::tensors_equal(params[i], test::tensor_from_bits(s.at("final_params")[i]))) << "parameter " << i;
}

INSTANTIATE_TEST_SUITE_P(Scenarios, GradScalerGolden, ::testing::Values(0, 1, 2, 3));

// A tiny problem for the API tests.
struct Toy {
  torch::nn::Linear model{4, 2};
  torch::optim::SGD optimizer{model->parameters(), torch::optim::SGDOptions(0.1)};
  torch::Tensor loss() { return model(torch::ones({3, 4})).pow(2).mean(); }
};

TEST(GradScaler, ChecksItsArgumentsLikePyTorch) {
  GradScalerConfig bad_growth;
  bad_growth.growth_factor = 1.0;
  EXPECT_TRUE(test::throws_with([&] { GradScaler s(bad_growth); }, {"growth factor must be > 1.0"}));
  GradScalerConfig bad_backoff;
  bad_backoff.backoff_factor = 1.0;
  EXPECT_TRUE(test::throws_with([&] { GradScaler s(bad_backoff); }, {"backoff factor must be < 1.0"}));
  bad_backoff.enabled = false;  // disabled: not checked, as in PyTorch
  EXPECT_NO_THROW(GradScaler s(bad_backoff));
}

TEST(GradScaler, ScaleIsCreatedLazilyOnTheLossDevice) {
  GradScaler scaler;
  EXPECT_FALSE(scaler.scale_tensor().defined());
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  auto scaled = scaler.scale(torch::tensor(2.0f));
  EXPECT_EQ(scaled.item<float>(), 131072.0f);
  ASSERT_TRUE(scaler.scale_tensor().defined());
  EXPECT_EQ(scaler.scale_tensor().dtype(), torch::kFloat32);
  EXPECT_EQ(scaler.scale_tensor().dim(), 0);
}

TEST(GradScaler, UnscaleTwiceOrAfterStepIsAnError) {
  Toy toy;
  GradScaler scaler;
  scaler.scale(toy.loss()).backward();
  scaler.unscale_(toy.optimizer);
  EXPECT_TRUE(test::throws_with([&] { scaler.unscale_(toy.optimizer); }, {"unscale_() has already been called"}));
  scaler.step(toy.optimizer);
  EXPECT_TRUE(test::throws_with([&] { scaler.unscale_(toy.optimizer); }, {"after step()"}));
  EXPECT_TRUE(test::throws_with([&] { scaler.step(toy.optimizer); }, {"step() has already been called"}));
  scaler.update();
  toy.optimizer.zero_grad();
  scaler.scale(toy.loss()).backward();
  EXPECT_NO_THROW(scaler.unscale_(toy.optimizer));  // update() reset the stage
}

TEST(GradScaler, UnscaleDividesByTheScale) {
  Toy toy;
  toy.loss().backward();
  auto expected = toy.model->weight.grad().clone();
  toy.optimizer.zero_grad();
  GradScaler scaler;
  scaler.scale(toy.loss()).backward();
  scaler.unscale_(toy.optimizer);
  // 65536 is a power of two: scaling and unscaling are exact.
  EXPECT_TRUE(test::tensors_equal(toy.model->weight.grad(), expected));
}

TEST(GradScaler, Fp16GradientsAreRefused) {
  torch::nn::Linear half(torch::nn::LinearOptions(4, 2));
  half->to(torch::kHalf);
  torch::optim::SGD optimizer(half->parameters(), torch::optim::SGDOptions(0.1));
  GradScaler scaler;
  scaler.scale(torch::tensor(1.0f));
  for (auto& p : half->parameters()) p.mutable_grad() = torch::ones_like(p);
  EXPECT_TRUE(test::throws_with([&] { scaler.unscale_(optimizer); }, {"FP16 gradients"}));
}

TEST(GradScaler, UseBeforeScaleIsAnError) {
  Toy toy;
  GradScaler scaler;
  EXPECT_TRUE(test::throws_with([&] { scaler.unscale_(toy.optimizer); }, {"not initialized"}));
  EXPECT_TRUE(test::throws_with([&] { scaler.update(); }, {"not initialized"}));
}

TEST(GradScaler, UpdateWithoutInfChecksIsAnError) {
  GradScaler scaler;
  scaler.scale(torch::tensor(1.0f));
  EXPECT_TRUE(test::throws_with([&] { scaler.update(); }, {"no inf checks were recorded"}));
}

TEST(GradScaler, SkipsTheStepAndBacksOffOnInf) {
  Toy toy;
  GradScaler scaler;
  scaler.scale(toy.loss()).backward();
  toy.model->bias.grad()[0] = INFINITY;
  auto before = toy.model->weight.clone();
  EXPECT_FALSE(scaler.step(toy.optimizer));
  scaler.update();
  EXPECT_TRUE(test::tensors_equal(toy.model->weight, before));
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST(GradScaler, ExplicitNewScale) {
  Toy toy;
  GradScaler scaler;
  scaler.scale(toy.loss()).backward();
  scaler.step(toy.optimizer);
  scaler.update(1024.0);
  EXPECT_EQ(scaler.get_scale(), 1024.0);
}

TEST(GradScaler, DisabledIsAPassThrough) {
  Toy toy;
  GradScalerConfig config;
  config.enabled = false;
  GradScaler scaler(config);
  auto loss = toy.loss();
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  loss.backward();
  auto grad = toy.model->weight.grad().clone();
  scaler.unscale_(toy.optimizer);
  EXPECT_TRUE(test::tensors_equal(toy.model->weight.grad(), grad));
  EXPECT_TRUE(scaler.step(toy.optimizer));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1.0);
}

TEST(GradScaler, StateRoundTrip) {
  Toy toy;
  GradScalerConfig config;
  config.growth_interval = 3;
  GradScaler a(config);
  for (int i = 0; i < 2; ++i) {
    toy.optimizer.zero_grad();
    a.scale(toy.loss()).backward();
    a.step(toy.optimizer);
    a.update();
  }
  GradScalerState state = a.state();
  EXPECT_EQ(state.growth_tracker, 2);
  EXPECT_EQ(state.growth_interval, 3);
  GradScaler b;  // loads before its scale exists: used on the first scale()
  b.load_state(state);
  EXPECT_EQ(b.get_scale(), a.get_scale());
  EXPECT_EQ(b.growth_tracker(), 2);
  toy.optimizer.zero_grad();
  b.scale(toy.loss()).backward();
  b.step(toy.optimizer);
  b.update();  // third clean step: grows
  EXPECT_EQ(b.get_scale(), state.scale * 2);
}

TEST(GradScaler, FoundInfReducerSeesTheFlag) {
  Toy toy;
  GradScaler scaler;
  int calls = 0;
  scaler.set_found_inf_reducer([&](torch::Tensor& found_inf) {
    ++calls;
    found_inf.fill_(1.0);  // as if another rank overflowed
  });
  scaler.scale(toy.loss()).backward();
  EXPECT_FALSE(scaler.step(toy.optimizer));
  EXPECT_EQ(calls, 1);
}

TEST(GradClip, MatchesPyTorchsFormula) {
  Toy toy;
  toy.loss().backward();
  auto params = toy.model->parameters();
  double total = std::sqrt(params[0].grad().pow(2).sum().item<double>() + params[1].grad().pow(2).sum().item<double>());
  auto weight_grad = params[0].grad().clone();
  auto norm = clip_grad_norm_(params, total / 2);
  EXPECT_NEAR(norm.item<double>(), total, 1e-5);
  EXPECT_TRUE(test::tensors_close(params[0].grad(), weight_grad * 0.5, 1e-5, 0));
  auto unchanged = params[0].grad().clone();
  clip_grad_norm_(params, total * 10);  // below the limit: coefficient clamps to 1
  EXPECT_TRUE(test::tensors_equal(params[0].grad(), unchanged));
}

TEST(Precision, AutocastGuardRestoresStateAndNests) {
  ASSERT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  auto previous_dtype = at::autocast::get_autocast_dtype(at::kCPU);
  {
    AutocastGuard outer(at::kCPU, at::kBFloat16);
    EXPECT_TRUE(at::autocast::is_autocast_enabled(at::kCPU));
    auto a = torch::randn({4, 4});
    EXPECT_EQ(torch::mm(a, a).scalar_type(), at::kBFloat16);
    {
      AutocastGuard inner(at::kCPU, at::kBFloat16, /*enabled=*/false);
      EXPECT_EQ(torch::mm(a, a).scalar_type(), at::kFloat);
    }
    EXPECT_TRUE(at::autocast::is_autocast_enabled(at::kCPU));
    EXPECT_EQ(torch::mm(a, a).scalar_type(), at::kBFloat16);
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  EXPECT_EQ(at::autocast::get_autocast_dtype(at::kCPU), previous_dtype);
}

TEST(Precision, GuardFromPrecisionIsANoOpForFp32) {
  AutocastGuard guard(torch::Device(torch::kCPU), Precision::fp32);
  auto a = torch::randn({2, 2});
  EXPECT_EQ(torch::mm(a, a).scalar_type(), at::kFloat);
}

TEST(Precision, CpuSupportsFp32AndBf16Only) {
  EXPECT_TRUE(is_supported(Precision::fp32, torch::kCPU));
  EXPECT_TRUE(is_supported(Precision::bf16_mixed, torch::kCPU));
  EXPECT_TRUE(test::throws_with([] { check_supported(Precision::fp16_mixed, torch::kCPU); }, {"train.precision", "fp16-mixed needs a GPU"}));
  EXPECT_TRUE(test::throws_with([] { check_supported(Precision::tf32, torch::kCPU); }, {"tf32 needs"}));
}

TEST(Precision, Tf32GuardRestoresFlags) {
  bool cublas = at::globalContext().allowTF32CuBLAS();
  {
    Tf32Guard guard(!cublas);
    EXPECT_EQ(at::globalContext().allowTF32CuBLAS(), !cublas);
  }
  EXPECT_EQ(at::globalContext().allowTF32CuBLAS(), cublas);
}

}  // namespace
}  // namespace amplab

namespace amplab {
namespace {

// PyTorch's fused SGD path: the scaler hands the scale and the inf flag to the kernel, which
// unscales and skips on the device. Same result as unscale_ + SGD up to rounding (the fused
// kernel divides by the scale and orders its operations differently).
TEST(FusedSgd, MatchesPlainSgdUnderTheScalerAndSkipsOnTheDevice) {
  torch::manual_seed(3);
  torch::nn::Linear plain(6, 3), fused(6, 3);
  {
    torch::NoGradGuard g;
    fused->weight.copy_(plain->weight);
    fused->bias.copy_(plain->bias);
  }
  auto options = torch::optim::SGDOptions(0.1).momentum(0.9);
  torch::optim::SGD sgd(plain->parameters(), options);
  FusedSGD fused_sgd(fused->parameters(), options);
  GradScaler a, b;
  auto x = torch::randn({5, 6});
  for (int step = 0; step < 4; ++step) {
    for (auto* pair : {&a, &b}) (void)pair;
    sgd.zero_grad();
    fused_sgd.zero_grad();
    a.scale(plain(x).pow(2).mean()).backward();
    b.scale(fused(x).pow(2).mean()).backward();
    if (step == 2) {  // an overflow: both must skip
      plain->bias.grad()[0] = INFINITY;
      fused->bias.grad()[0] = INFINITY;
    }
    auto before = fused->weight.clone();
    a.step(sgd);
    b.step(fused_sgd);
    EXPECT_EQ(b.found_inf().item<double>(), step == 2 ? 1.0 : 0.0);
    if (step == 2) {
      EXPECT_TRUE(test::tensors_equal(fused->weight, before));
    }
    a.update();
    b.update();
    EXPECT_EQ(a.get_scale(), b.get_scale());
  }
  EXPECT_TRUE(test::tensors_close(fused->weight, plain->weight, 1e-6, 1e-7));
  EXPECT_TRUE(test::tensors_close(fused->bias, plain->bias, 1e-6, 1e-7));
}

}  // namespace
}  // namespace amplab

namespace amplab {
namespace {

// Before a fused optimizer step the scaler only checks for inf/NaN (PyTorch's call with an
// inverse scale of 1); large gradients are checked by a read-only reduction instead of the
// check-and-unscale kernel. Either way: any inf, -inf or NaN is found, wherever it sits, and
// the gradients are left exactly as they were.
TEST(FusedSgd, InfCheckFindsEveryKindOfNonFiniteInLargeAndSmallGradients) {
  const int64_t large = int64_t{1} << 20;  // elements: checked by the read-only reduction
  for (float bad : {INFINITY, -INFINITY, NAN}) {
    for (bool in_large : {true, false}) {
      auto big = torch::zeros({large}, torch::requires_grad());
      auto small = torch::zeros({7}, torch::requires_grad());
      FusedSGD sgd({big, small}, torch::optim::SGDOptions(0.1));
      GradScaler scaler;
      scaler.scale((big.sum() + small.sum()) * 0.5).backward();
      (in_large ? big : small).grad()[in_large ? large - 3 : 4] = bad;
      auto big_grad = big.grad().clone(), small_grad = small.grad().clone();
      scaler.step(sgd);
      EXPECT_EQ(scaler.found_inf().item<double>(), 1.0) << bad << (in_large ? " in the large gradient" : " in the small one");
      EXPECT_TRUE(test::tensors_equal(big.grad(), big_grad));
      EXPECT_TRUE(test::tensors_equal(small.grad(), small_grad));
      EXPECT_EQ(big.abs().max().item<double>(), 0.0);  // skipped: nothing moved
      scaler.update();
      EXPECT_EQ(scaler.get_scale(), 32768.0);
    }
  }
  // All finite: the step is taken, with the gradients unscaled inside the fused kernel.
  auto big = torch::zeros({large}, torch::requires_grad());
  FusedSGD sgd({big}, torch::optim::SGDOptions(0.5));
  GradScaler scaler;
  scaler.scale(big.sum()).backward();
  scaler.step(sgd);
  EXPECT_EQ(scaler.found_inf().item<double>(), 0.0);
  EXPECT_TRUE(test::tensors_equal(big.detach(), torch::full({large}, -0.5f)));
}

}  // namespace
}  // namespace amplab
