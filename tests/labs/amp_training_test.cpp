// Graded tests of lab 2 (AMP training). Each test names the TODO it grades; every one fails on
// the untouched starter (AMPLAB_TODO throws) and passes on a correct solution. They run on the
// CPU: fp32 with the GradScaler forced on stands in for fp16 (the scaler's arithmetic is the
// same), and CPU autocast runs bf16. Tests named *_CUDA need a GPU and are skipped without one.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/autocast_mode.h>

#include <chrono>
#include <limits>
#include <thread>

#include "amp_training.hpp"
#include "amplab/trainer.hpp"
#include "support.hpp"

namespace {
namespace test = amplab::test;
using amplab::Precision;

// The core trainer tests' toy problem: 6 features, 3 classes.
struct Toy : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  Toy() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
};

// A second model with the same initial parameters as `source`.
std::shared_ptr<Toy> copy_of(const Toy& source) {
  auto copy = std::make_shared<Toy>();
  torch::NoGradGuard no_grad;
  auto from = source.parameters();
  auto to = copy->parameters();
  for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
  return copy;
}

amplab::LossFn cross_entropy(std::shared_ptr<Toy> net) {
  return [net](const amplab::Batch& b) { return torch::nn::functional::cross_entropy(net->forward(b.input), b.target); };
}

struct ToyData {
  torch::Tensor x, y;
  explicit ToyData(int64_t n, torch::Device device = torch::kCPU) {
    auto g = at::make_generator<at::CPUGeneratorImpl>(7);
    x = torch::randn({n, 6}, g).to(device);
    y = torch::randint(0, 3, {n}, g, torch::kInt64).to(device);
  }
  amplab::Batch batch(int64_t index, int64_t size) const {
    int64_t start = (index * size) % x.size(0);
    return {x.narrow(0, start, size), y.narrow(0, start, size)};
  }
};

amplab::TrainConfig toy_config(Precision precision, const std::string& loss_scaling, double clip = 0.0) {
  amplab::TrainConfig c;
  c.precision = precision;
  c.loss_scaling = loss_scaling;
  c.grad_clip_norm = clip;
  c.optimizer.lr = 0.1;
  c.optimizer.momentum = 0.9;
  c.grad_scaler.growth_interval = 2;  // the scale changes within a few steps: update() must run
  c.progress = false;
  return c;
}

// ---- TODO(amp_training-1..5): the whole step against the core's reference step ----------------

struct StepCase {
  const char* name;
  Precision precision;
  const char* loss_scaling;
  double clip;
};
void PrintTo(const StepCase& c, std::ostream* os) { *os << c.name; }

class AmpTrainingStep_MatchesCoreTrainer : public ::testing::TestWithParam<StepCase> {};

// Six steps of your train_step and of amplab::Trainer::step from the same parameters and config
// must give the same losses, gradient norms, parameters and loss scale. Both run the same CPU
// kernels in the same order, so they agree to the bit in practice; the few-ulp tolerance
// (rtol 1e-6) admits equivalent orderings, e.g. unscaling explicitly or inside step(): with a
// power-of-two scale, multiplying by its reciprocal is exact either way.
TEST_P(AmpTrainingStep_MatchesCoreTrainer, ParametersLossesAndScaleAfterSixSteps) {
  const StepCase& c = GetParam();
  torch::manual_seed(0);
  ToyData data(48);
  auto mine = std::make_shared<Toy>();
  auto reference = copy_of(*mine);
  auto config = toy_config(c.precision, c.loss_scaling, c.clip);
  amp_training::AmpTraining training(mine, cross_entropy(mine), config, torch::kCPU);
  amplab::Trainer trainer(reference, cross_entropy(reference), config, torch::kCPU);
  for (int step = 0; step < 6; ++step) {
    amplab::Batch batch = data.batch(step, 8);
    amplab::StepResult got = amp_training::train_step(training, batch);
    amplab::StepResult want = trainer.step(1, [&](int64_t) { return batch; });
    ASSERT_TRUE(got.loss.defined()) << "step " << step << ": train_step returned no loss";
    EXPECT_TRUE(test::tensors_close(got.loss, want.loss, 1e-6, 1e-7)) << "loss of step " << step;
    if (c.clip > 0) {
      ASSERT_TRUE(got.grad_norm.defined()) << "step " << step << ": clipping is on but result.grad_norm is not set";
      EXPECT_TRUE(test::tensors_close(got.grad_norm, want.grad_norm, 1e-6, 1e-7)) << "gradient norm of step " << step;
    }
    EXPECT_EQ(got.samples, 8);
  }
  auto got = mine->named_parameters();
  auto want = reference->named_parameters();
  for (const auto& item : want)
    EXPECT_TRUE(test::tensors_close(got[item.key()], item.value(), 1e-6, 1e-7)) << "parameter " << item.key();
  EXPECT_EQ(training.scaler.is_enabled(), trainer.scaler().is_enabled());
  EXPECT_EQ(training.scaler.get_scale(), trainer.scaler().get_scale()) << "loss scale after 6 steps";
  EXPECT_EQ(training.scaler.growth_tracker(), trainer.scaler().growth_tracker());
  for (const auto& p : mine->parameters()) EXPECT_FALSE(p.grad().defined()) << "gradients are cleared after a step";
}

INSTANTIATE_TEST_SUITE_P(
    Configs, AmpTrainingStep_MatchesCoreTrainer,
    ::testing::Values(StepCase{"fp32", Precision::fp32, "auto", 0.0},
                      StepCase{"fp32_scaled_clipped", Precision::fp32, "on", 0.5},
                      StepCase{"fp32_scaled", Precision::fp32, "on", 0.0},
                      StepCase{"bf16_mixed_clipped", Precision::bf16_mixed, "auto", 0.5}),
    [](const ::testing::TestParamInfo<StepCase>& info) { return std::string(info.param.name); });

// ---- TODO(amp_training-1): the forward pass under autocast -------------------------------------

// bf16-mixed on the CPU: outputs in bf16 under autocast, parameters still fp32, no scaler, and
// the model learns.
TEST(AmpTraining1_Autocast, Bf16RunsUnderAutocastWithoutAScaler) {
  torch::manual_seed(0);
  ToyData data(64);
  auto net = std::make_shared<Toy>();
  torch::ScalarType seen = torch::kFloat;
  amplab::LossFn loss_fn = [&](const amplab::Batch& b) {
    auto logits = net->forward(b.input);
    seen = logits.scalar_type();
    return torch::nn::functional::cross_entropy(logits, b.target);
  };
  amp_training::AmpTraining training(net, loss_fn, toy_config(Precision::bf16_mixed, "auto"), torch::kCPU);
  EXPECT_FALSE(training.scaler.is_enabled()) << "bf16-mixed needs no loss scaling";
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    auto r = amp_training::train_step(training, data.batch(step, 16));
    EXPECT_FALSE(r.skipped.defined()) << "without a scaler there is nothing to skip";
    if (step == 0) first = r.loss.item<double>();
    last = r.loss.item<double>();
  }
  EXPECT_EQ(seen, torch::kBFloat16) << "the forward pass did not run under autocast";
  EXPECT_EQ(net->fc1->weight.scalar_type(), torch::kFloat) << "parameters stay fp32";
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU)) << "autocast must end with the forward pass";
  EXPECT_LT(last, first * 0.9);
}

// The guard covers the forward pass only: backward and the optimizer run outside it.
TEST(AmpTraining1_Autocast, BackwardRunsOutsideAutocast) {
  torch::manual_seed(0);
  ToyData data(8);
  auto net = std::make_shared<Toy>();
  bool forward_under_autocast = false, backward_under_autocast = true;
  amplab::LossFn loss_fn = [&](const amplab::Batch& b) {
    forward_under_autocast = at::autocast::is_autocast_enabled(at::kCPU);
    return torch::nn::functional::cross_entropy(net->forward(b.input), b.target);
  };
  net->fc1->weight.register_hook([&](torch::Tensor grad) {
    backward_under_autocast = at::autocast::is_autocast_enabled(at::kCPU);
    return grad;
  });
  amp_training::AmpTraining training(net, loss_fn, toy_config(Precision::bf16_mixed, "auto"), torch::kCPU);
  amp_training::train_step(training, data.batch(0, 8));
  EXPECT_TRUE(forward_under_autocast);
  EXPECT_FALSE(backward_under_autocast);
}

// ---- TODO(amp_training-2): the scaler a precision needs ----------------------------------------

TEST(AmpTraining2_Scaler, EnabledForFp16OnlyUnlessForced) {
  amplab::GradScalerConfig config;
  EXPECT_TRUE(amp_training::make_grad_scaler(Precision::fp16_mixed, "auto", config).is_enabled());
  EXPECT_FALSE(amp_training::make_grad_scaler(Precision::bf16_mixed, "auto", config).is_enabled());
  EXPECT_FALSE(amp_training::make_grad_scaler(Precision::fp32, "auto", config).is_enabled());
  EXPECT_FALSE(amp_training::make_grad_scaler(Precision::tf32, "auto", config).is_enabled());
  EXPECT_TRUE(amp_training::make_grad_scaler(Precision::fp32, "on", config).is_enabled());
  EXPECT_TRUE(amp_training::make_grad_scaler(Precision::bf16_mixed, "on", config).is_enabled());
  EXPECT_FALSE(amp_training::make_grad_scaler(Precision::fp16_mixed, "off", config).is_enabled());
}

TEST(AmpTraining2_Scaler, KeepsTheConfiguredSettings) {
  amplab::GradScalerConfig config;
  config.init_scale = 1024.0;
  config.growth_interval = 7;
  config.backoff_factor = 0.25;
  auto scaler = amp_training::make_grad_scaler(Precision::fp16_mixed, "auto", config);
  ASSERT_TRUE(scaler.is_enabled());
  auto state = scaler.state();
  EXPECT_EQ(state.scale, 1024.0);
  EXPECT_EQ(state.growth_interval, 7);
  EXPECT_EQ(state.backoff_factor, 0.25);
}

// ---- TODO(amp_training-3): backward of the scaled loss -----------------------------------------

// With the scaler on, the gradients that backward produces are S = 65536 times those of the
// plain loss (a hook sees them as they arrive, before any unscaling), and after the step the
// parameters are the same as without scaling (S is a power of two: scaling is exact).
TEST(AmpTraining3_ScaledBackward, BackwardSeesGradientsTimesTheScale) {
  torch::manual_seed(0);
  ToyData data(8);
  auto plain_net = std::make_shared<Toy>();
  auto scaled_net = copy_of(*plain_net);
  torch::Tensor plain_grad, scaled_grad;
  plain_net->fc2->bias.register_hook([&](torch::Tensor g) { plain_grad = g.clone(); return g; });
  scaled_net->fc2->bias.register_hook([&](torch::Tensor g) { scaled_grad = g.clone(); return g; });
  amp_training::AmpTraining plain(plain_net, cross_entropy(plain_net), toy_config(Precision::fp32, "off"), torch::kCPU);
  amp_training::AmpTraining scaled(scaled_net, cross_entropy(scaled_net), toy_config(Precision::fp32, "on"), torch::kCPU);
  auto batch = data.batch(0, 8);
  amp_training::train_step(plain, batch);
  amp_training::train_step(scaled, batch);
  ASSERT_TRUE(plain_grad.defined() && scaled_grad.defined()) << "no backward pass ran";
  EXPECT_TRUE(test::tensors_equal(scaled_grad, plain_grad * 65536.0)) << "backward must run on scaler.scale(loss)";
  EXPECT_TRUE(test::tensors_equal(scaled_net->fc2->weight, plain_net->fc2->weight));
}

// ---- TODO(amp_training-4): unscale before clipping ---------------------------------------------

// Clipping must see the true gradients: the norm it returns, and the clipped update, are the
// same with loss scaling as without. (Clipping scaled gradients would see a norm S times too
// large and shrink the update by S.)
TEST(AmpTraining4_UnscaleBeforeClip, ClippedNormIsThatOfTheUnscaledGradients) {
  torch::manual_seed(0);
  ToyData data(8);
  auto plain_net = std::make_shared<Toy>();
  auto scaled_net = copy_of(*plain_net);
  const double max_norm = 0.05;
  amp_training::AmpTraining plain(plain_net, cross_entropy(plain_net), toy_config(Precision::fp32, "off", max_norm),
                                  torch::kCPU);
  amp_training::AmpTraining scaled(scaled_net, cross_entropy(scaled_net), toy_config(Precision::fp32, "on", max_norm),
                                   torch::kCPU);
  auto batch = data.batch(0, 8);
  auto a = amp_training::train_step(plain, batch);
  auto b = amp_training::train_step(scaled, batch);
  ASSERT_TRUE(a.grad_norm.defined() && b.grad_norm.defined()) << "result.grad_norm must be set when clipping";
  double plain_norm = a.grad_norm.item<double>(), scaled_norm = b.grad_norm.item<double>();
  ASSERT_GT(plain_norm, max_norm) << "the test needs a norm that gets clipped";
  EXPECT_NEAR(scaled_norm, plain_norm, 1e-6 * plain_norm)
      << "with loss scaling the clipped norm was " << scaled_norm / plain_norm << " times the true one: unscale_ first";
  auto got = scaled_net->named_parameters();
  for (const auto& item : plain_net->named_parameters())
    EXPECT_TRUE(test::tensors_close(got[item.key()], item.value(), 1e-6, 1e-7)) << "parameter " << item.key();
}

// ---- TODO(amp_training-5): step or skip, then update -------------------------------------------

// A loss spike that overflows once multiplied by the loss scale: the step is skipped (parameters
// unchanged), the scale backs off 65536 -> 32768, and clean steps then count towards growth
// (growth_interval 2: back to 65536 after two).
TEST(AmpTraining5_SkipAndUpdate, InjectedOverflowSkipsTheStepAndBacksOff) {
  torch::manual_seed(0);
  ToyData data(16);
  auto net = std::make_shared<Toy>();
  bool overflow = true;
  amplab::LossFn loss_fn = [&](const amplab::Batch& b) {
    auto loss = torch::nn::functional::cross_entropy(net->forward(b.input), b.target);
    return overflow ? loss * 1e38 : loss;  // finite in fp32, inf once multiplied by 65536
  };
  amp_training::AmpTraining training(net, loss_fn, toy_config(Precision::fp32, "on"), torch::kCPU);
  auto before = net->fc1->weight.clone();
  auto r = amp_training::train_step(training, data.batch(0, 8));
  ASSERT_TRUE(r.skipped.defined()) << "with loss scaling, result.skipped must say whether the step was skipped";
  EXPECT_EQ(r.skipped.item<double>(), 1.0);
  EXPECT_TRUE(test::tensors_equal(net->fc1->weight, before)) << "an overflowing step must not change the parameters";
  EXPECT_EQ(training.scaler.get_scale(), 32768.0) << "the scale backs off by half after an overflow";
  EXPECT_EQ(training.scaler.growth_tracker(), 0);
  for (const auto& p : net->parameters()) EXPECT_FALSE(p.grad().defined()) << "the inf gradients are cleared too";

  overflow = false;
  r = amp_training::train_step(training, data.batch(1, 8));
  EXPECT_EQ(r.skipped.item<double>(), 0.0);
  EXPECT_FALSE(test::tensors_equal(net->fc1->weight, before)) << "a clean step updates the parameters";
  EXPECT_EQ(training.scaler.get_scale(), 32768.0);
  EXPECT_EQ(training.scaler.growth_tracker(), 1);
  amp_training::train_step(training, data.batch(0, 8));
  EXPECT_EQ(training.scaler.get_scale(), 65536.0) << "after growth_interval clean steps the scale doubles";
  EXPECT_EQ(training.scaler.growth_tracker(), 0);
}

// ---- TODO(amp_training-6): speed and memory ----------------------------------------------------

TEST(AmpTraining6_Measure, WarmsUpThenTimesWindowsOfSteps) {
  int calls = 0;
  auto step = [&] {
    ++calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return torch::full({}, static_cast<float>(calls));
  };
  auto stats = amp_training::measure_steps(step, torch::kCPU, /*warmup=*/2, /*repeats=*/3, /*window=*/4);
  EXPECT_EQ(calls, 2 + 3 * 4);
  EXPECT_EQ(stats.step_ms.count, 3u) << "one sample per timed window";
  EXPECT_GE(stats.step_ms.min, 2.0) << "each step sleeps 2 ms";
  EXPECT_LT(stats.step_ms.median, 6.0) << "ms per *step*: divide a window's time by its steps";
  EXPECT_EQ(stats.final_loss, 14.0) << "the loss of the last step";
  EXPECT_GT(stats.peak_mib, 0.0);
}

amp_training::PrecisionResult row(const std::string& model, Precision precision, bool ran, double ms, double mib) {
  amp_training::PrecisionResult r;
  r.model = model;
  r.precision = precision;
  r.ran = ran;
  r.stats.step_ms.median = ms;
  r.stats.peak_mib = mib;
  return r;
}

TEST(AmpTraining6_Measure, SpeedupAndMemoryAgainstFp32OfTheSameModel) {
  std::vector<amp_training::PrecisionResult> results = {
      row("mlp", Precision::fp32, true, 10.0, 100.0), row("mlp", Precision::bf16_mixed, true, 4.0, 80.0),
      row("cnn", Precision::fp32, false, 0.0, 0.0), row("cnn", Precision::bf16_mixed, true, 2.0, 50.0),
      row("mlp", Precision::fp16_mixed, true, 5.0, 120.0)};
  amp_training::compare_to_fp32(results);
  EXPECT_DOUBLE_EQ(results[0].speedup_vs_fp32, 1.0);
  EXPECT_DOUBLE_EQ(results[0].memory_vs_fp32, 1.0);
  EXPECT_DOUBLE_EQ(results[1].speedup_vs_fp32, 2.5);
  EXPECT_DOUBLE_EQ(results[1].memory_vs_fp32, 0.8);
  EXPECT_DOUBLE_EQ(results[4].speedup_vs_fp32, 2.0);
  EXPECT_DOUBLE_EQ(results[4].memory_vs_fp32, 1.2);
  EXPECT_EQ(results[3].speedup_vs_fp32, 0.0) << "cnn has no fp32 result that ran";
  EXPECT_EQ(results[3].memory_vs_fp32, 0.0);
}

// ---- On a GPU ----------------------------------------------------------------------------------

struct GpuMlp : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  GpuMlp() {
    fc1 = register_module("fc1", torch::nn::Linear(256, 256));
    fc2 = register_module("fc2", torch::nn::Linear(256, 10));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
};

amplab::TrainConfig gpu_config(Precision precision) {
  amplab::TrainConfig c;
  c.precision = precision;
  c.optimizer.lr = 0.01;
  c.optimizer.momentum = 0.9;
  c.optimizer.fused = true;  // the scaler hands the scale and the inf flag to the kernel: no host sync
  c.progress = false;
  return c;
}

// fp16-mixed with the fused SGD: half outputs, the step skipped on the device after an overflow,
// the scale halved; the same parameters as the core trainer's step otherwise. (Not bitwise:
// the trainer unscales in a kernel of its own, your step may leave it to the fused SGD; both
// are exact for a power-of-two scale, but cuBLAS may pick different kernels run to run.)
TEST(AmpTrainingGpu, Fp16StepSkipsOverflowsAndMatchesTheTrainer_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  torch::Device gpu(torch::kCUDA, 0);
  torch::manual_seed(0);
  auto mine = std::make_shared<GpuMlp>();
  auto reference = std::make_shared<GpuMlp>();
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < mine->parameters().size(); ++i) reference->parameters()[i].copy_(mine->parameters()[i]);
  }
  mine->to(gpu);
  reference->to(gpu);
  bool overflow = false;
  torch::ScalarType seen = torch::kFloat;
  auto loss_of = [&](GpuMlp& net) {
    return [&](const amplab::Batch& b) {
      auto out = net.forward(b.input);
      seen = out.scalar_type();
      auto loss = torch::nn::functional::cross_entropy(out, b.target);
      return overflow ? loss * 1e38 : loss;
    };
  };
  amp_training::AmpTraining training(mine, loss_of(*mine), gpu_config(Precision::fp16_mixed), gpu);
  amplab::Trainer trainer(reference, loss_of(*reference), gpu_config(Precision::fp16_mixed), gpu);
  amplab::Batch batch{torch::randn({64, 256}, gpu), torch::randint(0, 10, {64}, torch::dtype(torch::kInt64).device(gpu))};
  for (int step = 0; step < 5; ++step) {
    overflow = step == 2;
    auto before = mine->fc1->weight.clone();
    auto got = amp_training::train_step(training, batch);
    trainer.step(1, [&](int64_t) { return batch; });
    EXPECT_EQ(seen, torch::kHalf);
    ASSERT_TRUE(got.skipped.defined());
    EXPECT_EQ(got.skipped.item<double>(), step == 2 ? 1.0 : 0.0) << "step " << step;
    if (step == 2) {
      EXPECT_TRUE(test::tensors_equal(mine->fc1->weight, before));
      EXPECT_EQ(training.scaler.get_scale(), 32768.0);
    }
  }
  for (size_t i = 0; i < mine->parameters().size(); ++i)
    EXPECT_TRUE(test::tensors_close(mine->parameters()[i], reference->parameters()[i], 1e-4, 1e-6)) << "parameter " << i;
}

TEST(AmpTrainingGpu, Bf16HasNoScalerAndBf16Outputs_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  torch::Device gpu(torch::kCUDA, 0);
  torch::manual_seed(0);
  auto net = std::make_shared<GpuMlp>();
  net->to(gpu);
  torch::ScalarType seen = torch::kFloat;
  amplab::LossFn loss_fn = [&](const amplab::Batch& b) {
    auto out = net->forward(b.input);
    seen = out.scalar_type();
    return torch::nn::functional::cross_entropy(out, b.target);
  };
  amp_training::AmpTraining training(net, loss_fn, gpu_config(Precision::bf16_mixed), gpu);
  EXPECT_FALSE(training.scaler.is_enabled());
  amplab::Batch batch{torch::randn({64, 256}, gpu), torch::randint(0, 10, {64}, torch::dtype(torch::kInt64).device(gpu))};
  double first = amp_training::train_step(training, batch).loss.item<double>(), last = first;
  for (int i = 0; i < 20; ++i) last = amp_training::train_step(training, batch).loss.item<double>();
  EXPECT_EQ(seen, torch::kBFloat16);
  EXPECT_EQ(net->fc1->weight.scalar_type(), torch::kFloat);
  EXPECT_LT(last, first);
}

}  // namespace
