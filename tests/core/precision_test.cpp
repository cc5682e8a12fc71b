// The precision switch (AutocastGuard, Tf32Guard, what each device supports) and gradient
// clipping: the core's parts of mixed precision. The GradScaler is lab 2's
// (tests/labs/amp_training_test.cpp replays PyTorch's against it).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/autocast_mode.h>

#include <cmath>

#include "amplab/train/grad_clip.hpp"
#include "amplab/train/precision.hpp"
#include "support.hpp"

namespace amplab {
namespace {

// A tiny problem for the clipping test.
struct Toy {
  torch::nn::Linear model{4, 2};
  torch::Tensor loss() { return model(torch::ones({3, 4})).pow(2).mean(); }
};

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
