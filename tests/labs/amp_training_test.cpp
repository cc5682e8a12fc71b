// Graded tests of lab 2 (AMP training). Each test names the TODO it grades; every one fails on
// the untouched starter (AMPLAB_TODO throws) and passes on a correct solution. They run on the
// CPU: fp32 with the GradScaler forced on stands in for fp16 (the scaler's arithmetic is the
// same), CPU autocast runs bf16 (and fp16, for the underflow measurement). Tests named *_CUDA
// need a GPU and are skipped without one.
//
// The GradScaler is graded against PyTorch's own: tests/fixtures/grad_scaler_golden.json holds
// torch.amp.GradScaler's runs on a small model (made by make_grad_scaler_golden.py with the
// torch this project links), and your scaler must reproduce its scale, growth tracker, skips and
// final parameters to the last bit.
#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/autocast_mode.h>
#if AMPLAB_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "amp_training.hpp"
#include "amplab/fast/fast_path.hpp"
#include "amplab/fast/fused_sgd.hpp"
#include "amplab/train/grad_clip.hpp"
#include "amplab/train/trainer.hpp"
#include "grad_scaler.hpp"
#include "support.hpp"

namespace {
namespace test = amplab::test;
using amp_training::GradScaler;
using amplab::GradScalerConfig;
using amplab::Precision;

// The golden replays pin the CPU kernels as the fixture script does: ATen's scalar ones and
// MKL's SSE2 path, so that the bits do not depend on the machine's vector units. Set before
// main(), before any torch op or MKL call reads them.
const bool kCpuKernelsPinned = [] {
  setenv("ATEN_CPU_CAPABILITY", "default", /*overwrite=*/1);
  setenv("MKL_CBWR", "COMPATIBLE", 1);
  return true;
}();

// The fixtures' model: Linear(8,16) -> ReLU -> Linear(16,4).
struct Mlp : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  Mlp() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
};

const nlohmann::json& scenario(const std::string& name) {
  static const nlohmann::json golden = test::load_fixture("grad_scaler_golden.json");
  for (const auto& s : golden.at("scenarios"))
    if (s.at("name") == name) return s;
  throw std::runtime_error("no scenario " + name + " in grad_scaler_golden.json");
}

// The operators a block of code calls, as the dispatcher sees them (PyTorch's RecordFunction):
// the names of the ATen ops `work` ran on this thread.
std::vector<std::string> ops_called(const std::function<void()>& work) {
  static thread_local std::vector<std::string>* seen = nullptr;
  std::vector<std::string> names;
  seen = &names;
  auto handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback([](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
        if (seen) seen->push_back(fn.name());
        return nullptr;
      }).scopes({at::RecordScope::FUNCTION}));
  work();
  at::removeCallback(handle);
  seen = nullptr;
  return names;
}

// update(), checking that it is the student's own state machine: PyTorch's fused kernel for it
// (at::_amp_update_scale_) is TODO 9's, for optimizers that step on the device, not a plain one's.
void update_with_own_state_machine(GradScaler& scaler) {
  const std::vector<std::string> ops = ops_called([&] { scaler.update(); });
  const auto fused = std::count_if(ops.begin(), ops.end(),
                                   [](const std::string& op) { return op.find("_amp_update_scale") != std::string::npos; });
  EXPECT_EQ(fused, 0) << "update() called at::_amp_update_scale_ for a plain optimizer: write the state machine";
}

// Replays one recorded PyTorch run with your GradScaler: the same model, data, injected
// inf/NaN gradients, optimizers, clipping and state round trip; compares every step's scale
// before and after, growth tracker and skip, then the final parameters and momenta, bitwise.
// (Bitwise is fair: both sides run the same kernels of the same libtorch on one thread.) The
// tests of TODO 4 also check that update() is the student's own state machine.
void replay(const std::string& name, bool update_is_graded = false) {
  torch::set_num_threads(1);
  const auto& s = scenario(name);
  SCOPED_TRACE("PyTorch scenario " + name + " (tests/fixtures/make_grad_scaler_golden.py)");
  auto model = std::make_shared<Mlp>();
  auto params = model->parameters();
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(test::tensor_from_bits(s.at("initial_params")[i]));
  }
  torch::Tensor xs = test::tensor_from_bits(s.at("x")), ys = test::tensor_from_bits(s.at("y"));
  std::vector<std::unique_ptr<torch::optim::SGD>> optimizers;
  auto options = torch::optim::SGDOptions(0.05).momentum(0.9);
  if (s.at("two_optimizers").get<bool>()) {
    optimizers.push_back(std::make_unique<torch::optim::SGD>(std::vector<torch::Tensor>{params[0], params[1]}, options));
    optimizers.push_back(std::make_unique<torch::optim::SGD>(std::vector<torch::Tensor>{params[2], params[3]}, options));
  } else {
    optimizers.push_back(std::make_unique<torch::optim::SGD>(params, options));
  }
  GradScalerConfig config;
  config.init_scale = s.at("init_scale").get<double>();
  config.growth_interval = s.at("growth_interval").get<int64_t>();
  config.growth_factor = s.at("growth_factor").get<double>();
  config.backoff_factor = s.at("backoff_factor").get<double>();
  auto scaler = std::make_unique<GradScaler>(config);
  const double loss_multiplier = s.at("loss_multiplier").get<double>();
  const bool clip = !s.at("clip_norm").is_null();
  const int64_t round_trip_at = s.at("round_trip_at").is_null() ? -1 : s.at("round_trip_at").get<int64_t>();

  for (int64_t step = 0; step < s.at("steps").get<int64_t>(); ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const auto& expected = s.at("trace")[step];
    if (step == round_trip_at) {  // a checkpoint: the state into a fresh scaler
      auto state = scaler->state();
      scaler = std::make_unique<GradScaler>(config);
      scaler->load_state(state);
    }
    for (auto& o : optimizers) o->zero_grad(/*set_to_none=*/true);
    torch::Tensor loss = torch::mse_loss(model->forward(xs[step]), ys[step]) * loss_multiplier;
    ASSERT_EQ(scaler->get_scale(), expected.at("scale_before").get<double>()) << "the scale before the step";
    scaler->scale(loss).backward();
    if (auto it = s.at("injections").find(std::to_string(step)); it != s.at("injections").end()) {
      for (const auto& injection : *it) {
        std::string kind = injection[0];
        double value = kind == "nan" ? NAN : (kind == "inf" ? INFINITY : -INFINITY);
        torch::NoGradGuard no_grad;
        params[injection[1].get<size_t>()].grad().view(-1)[injection[2].get<int64_t>()] = value;
      }
    }
    if (clip) {
      for (auto& o : optimizers) scaler->unscale_(*o);
      amplab::clip_grad_norm_(params, s.at("clip_norm").get<double>());
    }
    for (size_t o = 0; o < optimizers.size(); ++o)
      EXPECT_EQ(scaler->step(*optimizers[o]), expected.at("stepped")[o].get<bool>()) << "step() of optimizer " << o;
    if (update_is_graded)
      update_with_own_state_machine(*scaler);
    else
      scaler->update();
    ASSERT_EQ(scaler->get_scale(), expected.at("scale_after").get<double>()) << "the scale after update()";
    ASSERT_EQ(scaler->growth_tracker(), expected.at("growth_tracker").get<int64_t>()) << "the growth tracker";
  }
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(test::tensors_equal(params[i], test::tensor_from_bits(s.at("final_params")[i]))) << "parameter " << i;
  size_t m = 0;
  for (auto& o : optimizers) {
    for (auto& p : o->param_groups()[0].params()) {
      const auto& want = s.at("final_momentum")[m++];
      if (want.is_null()) continue;
      auto& state = static_cast<torch::optim::SGDParamState&>(*o->state().at(p.unsafeGetTensorImpl()));
      EXPECT_TRUE(test::tensors_equal(state.momentum_buffer(), test::tensor_from_bits(want))) << "momentum " << m - 1;
    }
  }
}

// A tiny problem for the API tests.
struct Toy {
  torch::nn::Linear model{4, 2};
  torch::optim::SGD optimizer{model->parameters(), torch::optim::SGDOptions(0.1)};
  torch::Tensor loss() { return model(torch::ones({3, 4})).pow(2).mean(); }
};

// ---- TODO(amp_training-1): scale -----------------------------------------------------------------

TEST(AmpTraining1_Scale, MultipliesByTheScaleMadeLazilyOnTheLossDevice) {
  GradScalerConfig config;
  config.init_scale = 1000.0;
  GradScaler scaler(config);
  EXPECT_EQ(scaler.get_scale(), 1000.0) << "before the first scale(): init_scale";
  torch::Tensor loss = torch::tensor(0.123f);
  torch::Tensor scaled = scaler.scale(loss);
  ASSERT_TRUE(scaled.defined());
  EXPECT_EQ(scaled.scalar_type(), torch::kFloat);
  EXPECT_TRUE(test::tensors_equal(scaled, [&] { return loss * torch::tensor(1000.0f); }));
  EXPECT_EQ(scaler.get_scale(), 1000.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  EXPECT_TRUE(test::tensors_equal(scaler.scale(torch::tensor(2.0f)), torch::tensor(2000.0f))) << "the same scale again";
}

TEST(AmpTraining1_Scale, DisabledIsAPassThrough) {
  GradScalerConfig config;
  config.enabled = false;
  GradScaler scaler(config);
  torch::Tensor loss = torch::tensor(0.5f);
  EXPECT_TRUE(scaler.scale(loss).is_same(loss)) << "a disabled scaler returns the loss itself";
  EXPECT_EQ(scaler.get_scale(), 1.0);
  Toy toy;
  auto before = toy.model->weight.clone();
  scaler.scale(toy.loss()).backward();
  scaler.unscale_(toy.optimizer);
  EXPECT_TRUE(scaler.step(toy.optimizer)) << "a disabled scaler always steps";
  scaler.update();
  EXPECT_FALSE(test::tensors_equal(toy.model->weight, before));
}

// Once update() has changed the scale, scale() multiplies by the scale as it is now, not by
// init_scale (nor by a scale made afresh each call): a backoff to 32768, then growth to 65536 and
// 131072 (growth_interval 1). update(), step() and unscale_ are the reference's when this grades
// TODO 1; only the scale tensor's creation and use are yours.
TEST(AmpTraining1_Scale, MultipliesByTheCurrentScaleAfterUpdate) {
  GradScalerConfig config;
  config.growth_interval = 1;  // every clean step doubles the scale
  GradScaler scaler(config);
  Toy toy;
  auto training_step = [&](double multiplier) {
    toy.optimizer.zero_grad();
    scaler.scale(toy.loss() * multiplier).backward();
    scaler.step(toy.optimizer);
    scaler.update();
  };
  auto expect_scale_uses = [&](double current, const std::string& after) {
    ASSERT_EQ(scaler.get_scale(), current) << "the scale after " << after << " (update() is not graded here)";
    torch::Tensor loss = torch::tensor(0.375f);
    torch::Tensor scaled = scaler.scale(loss);
    ASSERT_TRUE(scaled.defined());
    const double used = scaled.item<double>() / 0.375;
    if (used != current)
      ADD_FAILURE() << "scale() used " << used << " after " << after << " to " << current
                    << ": multiply by the current scale (the tensor update() changes), not by init_scale";
    EXPECT_EQ(scaler.get_scale(), current) << "scale() must not reset the scale";
  };
  training_step(1e38);  // finite in fp32, inf once scaled: the step is skipped and the scale halves
  expect_scale_uses(32768.0, "a backoff");
  training_step(1.0);
  training_step(1.0);
  expect_scale_uses(131072.0, "two growths");
}

// ---- TODO(amp_training-2): unscale_ ---------------------------------------------------------------

// Each gradient times 1/S, where 1/S is computed in float64 and rounded to float32 as PyTorch
// does: with S = 1000 a float32 division differs from that in the last bit for some values.
TEST(AmpTraining2_Unscale, DividesEveryGradientByTheScaleToTheBit) {
  GradScalerConfig config;
  config.init_scale = 1000.0;
  GradScaler scaler(config);
  torch::manual_seed(0);
  auto w = torch::randn({257}, torch::requires_grad());
  auto b = torch::randn({3}, torch::requires_grad());
  torch::optim::SGD sgd({w, b}, torch::optim::SGDOptions(0.1));
  scaler.scale((w * torch::randn({257})).sum() + b.pow(3).sum()).backward();
  auto w_grad = w.grad().clone(), b_grad = b.grad().clone();
  scaler.unscale_(sgd);
  float inverse = static_cast<float>(1.0 / 1000.0);
  EXPECT_TRUE(test::tensors_equal(w.grad(), [&] { return w_grad * inverse; }));
  EXPECT_TRUE(test::tensors_equal(b.grad(), [&] { return b_grad * inverse; }));
}

TEST(AmpTraining2_Unscale, FindsInfAndNanInAnyGradientAtAnyPlace) {
  for (float bad : {INFINITY, -INFINITY, NAN}) {
    for (int where : {0, 1, 2}) {  // which gradient: the first, one in the middle, the last
      auto a = torch::zeros({5}, torch::requires_grad());
      auto skipped_no_grad = torch::zeros({2}, torch::requires_grad());
      auto b = torch::zeros({70}, torch::requires_grad());
      auto c = torch::zeros({1}, torch::requires_grad());
      torch::optim::SGD sgd({a, skipped_no_grad, b, c}, torch::optim::SGDOptions(0.1));
      GradScaler scaler;
      scaler.scale(a.sum() + b.sum() + c.sum()).backward();
      torch::Tensor target = where == 0 ? a : (where == 1 ? b : c);
      target.grad()[target.numel() - 1] = bad;
      scaler.unscale_(sgd);
      EXPECT_FALSE(scaler.step(sgd)) << bad << " in gradient " << where << " must skip the step";
      EXPECT_EQ(a.abs().max().item<double>(), 0.0) << "skipped: nothing moved";
    }
  }
}

TEST(AmpTraining2_Unscale, EnforcesPyTorchsRules) {
  Toy toy;
  GradScaler fresh;
  EXPECT_TRUE(test::throws_with([&] { fresh.unscale_(toy.optimizer); }, {"not initialized"}));
  GradScaler scaler;
  scaler.scale(toy.loss()).backward();
  scaler.unscale_(toy.optimizer);
  EXPECT_TRUE(test::throws_with([&] { scaler.unscale_(toy.optimizer); }, {"unscale_() has already been called"}));
  scaler.step(toy.optimizer);
  EXPECT_TRUE(test::throws_with([&] { scaler.unscale_(toy.optimizer); }, {"after step()"}));
  scaler.update();
  auto half = torch::zeros({3}, torch::dtype(torch::kHalf).requires_grad(true));
  torch::optim::SGD sgd({half}, torch::optim::SGDOptions(0.1));
  half.mutable_grad() = torch::ones({3}, torch::kHalf);
  EXPECT_TRUE(test::throws_with([&] { scaler.unscale_(sgd); }, {"FP16 gradients"}));
}

TEST(AmpTraining2_Unscale, PyTorchsRunWithInfAndNanInjected) { replay("inject_inf_nan"); }
TEST(AmpTraining2_Unscale, PyTorchsRunWithNanAndInfInSeveralParameters) { replay("nan_and_inf_in_different_parameters"); }
TEST(AmpTraining2_Unscale, PyTorchsRunWithUnscaleThenClip) { replay("unscale_then_clip"); }

// ---- TODO(amp_training-3): step ----------------------------------------------------------------

// After unscale_, step() must not divide again: the update is the plain one.
TEST(AmpTraining3_Step, UnscalesOnceWhetherOrNotUnscaleWasCalled) {
  for (bool unscale_first : {false, true}) {
    Toy plain, scaled;
    {
      torch::NoGradGuard g;
      scaled.model->weight.copy_(plain.model->weight);
      scaled.model->bias.copy_(plain.model->bias);
    }
    GradScaler scaler;  // 65536: a power of two, so the scaled update is exact
    scaler.scale(scaled.loss()).backward();
    if (unscale_first) scaler.unscale_(scaled.optimizer);
    EXPECT_TRUE(scaler.step(scaled.optimizer));
    // The plain step after the scaler's: while the code under test runs, its answer is nowhere in the process.
    plain.loss().backward();
    plain.optimizer.step();
    EXPECT_TRUE(test::tensors_equal(scaled.model->weight, plain.model->weight)) << "unscale_ first: " << unscale_first;
    EXPECT_EQ(scaler.found_inf().item<double>(), 0.0) << "found_inf() reports the last step";
    EXPECT_TRUE(test::throws_with([&] { scaler.step(scaled.optimizer); }, {"step() has already been called"}));
  }
}

TEST(AmpTraining3_Step, SkipsAnOverflowedStepAndReportsIt) {
  Toy toy;
  GradScaler scaler;
  auto before = toy.model->weight.clone();
  scaler.scale(toy.loss() * 1e38).backward();  // finite in fp32, inf once multiplied by 65536
  EXPECT_FALSE(scaler.step(toy.optimizer));
  EXPECT_TRUE(test::tensors_equal(toy.model->weight, before)) << "a skipped step changes nothing";
  ASSERT_TRUE(scaler.found_inf().defined());
  EXPECT_GT(scaler.found_inf().item<double>(), 0.0);
}

TEST(AmpTraining3_Step, PyTorchsRunWithTwoOptimizers) { replay("two_optimizers"); }

// ---- TODO(amp_training-4): update --------------------------------------------------------------

TEST(AmpTraining4_Update, BacksOffAtOnceAndGrowsAfterTheInterval) {
  GradScalerConfig config;
  config.growth_interval = 2;
  GradScaler scaler(config);
  Toy toy;
  EXPECT_TRUE(test::throws_with([&] { scaler.update(); }, {"not initialized"}));
  auto step = [&](double multiplier) {
    toy.optimizer.zero_grad();
    scaler.scale(toy.loss() * multiplier).backward();
    scaler.step(toy.optimizer);
    update_with_own_state_machine(scaler);
  };
  step(1e38);
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  step(1.0);
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  EXPECT_EQ(scaler.growth_tracker(), 1);
  step(1.0);
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  toy.optimizer.zero_grad();
  scaler.scale(toy.loss()).backward();
  EXPECT_TRUE(test::throws_with([&] { scaler.update(); }, {"no inf checks were recorded"}));
}

// The state machine is the TODO: PyTorch's one-kernel version of it is TODO 9's stretch, for
// optimizers that step on the device, and a plain optimizer's update() must not hand its work to it.
TEST(AmpTraining4_Update, WritesTheStateMachineRatherThanCallingPyTorchsKernel) {
  Toy toy;
  GradScaler scaler;
  for (double multiplier : {1e38, 1.0}) {  // an overflow, then a clean step
    toy.optimizer.zero_grad();
    scaler.scale(toy.loss() * multiplier).backward();
    scaler.step(toy.optimizer);
    update_with_own_state_machine(scaler);
  }
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  EXPECT_EQ(scaler.growth_tracker(), 1);
}

TEST(AmpTraining4_Update, PyTorchsDefaults) { replay("defaults", /*update_is_graded=*/true); }
TEST(AmpTraining4_Update, PyTorchsGrowthStopsBelowInfinity) { replay("growth_saturates", /*update_is_graded=*/true); }
TEST(AmpTraining4_Update, PyTorchsGrowthWithFactorsThatAreNotPowersOfTwo) {
  replay("growth_across_intervals", /*update_is_graded=*/true);
}

// ---- TODO(amp_training-5): state ---------------------------------------------------------------

TEST(AmpTraining5_State, RoundTripAndStartingFromALoadedState) {
  GradScalerConfig config;
  config.init_scale = 1024.0;
  config.growth_interval = 7;
  config.backoff_factor = 0.25;
  GradScaler scaler(config);
  auto state = scaler.state();
  EXPECT_EQ(state.scale, 1024.0);
  EXPECT_EQ(state.growth_interval, 7);
  EXPECT_EQ(state.backoff_factor, 0.25);
  EXPECT_EQ(state.growth_factor, 2.0);
  EXPECT_EQ(state.growth_tracker, 0);
  amplab::GradScalerState saved{256.0, 3.0, 0.125, 5, 4};
  GradScaler resumed;  // loaded before its first scale(): it must start from the loaded values
  resumed.load_state(saved);
  EXPECT_EQ(resumed.get_scale(), 256.0);
  EXPECT_EQ(resumed.growth_tracker(), 4);
  EXPECT_TRUE(test::tensors_equal(resumed.scale(torch::tensor(1.0f)), torch::tensor(256.0f)));
  auto back = resumed.state();
  EXPECT_EQ(back.growth_factor, 3.0);
  EXPECT_EQ(back.backoff_factor, 0.125);
  EXPECT_EQ(back.growth_interval, 5);
  EXPECT_EQ(back.growth_tracker, 4);
  GradScalerConfig off;
  off.enabled = false;
  GradScaler disabled(off);
  EXPECT_TRUE(test::throws_with([&] { disabled.state(); }, {"disabled"}));
}

TEST(AmpTraining5_State, PyTorchsRunThroughAStateRoundTrip) { replay("state_round_trip"); }

// ---- TODO(amp_training-6): the scaler a config asks for ------------------------------------------

amplab::TrainConfig config_with(Precision precision, const std::string& loss_scaling) {
  amplab::TrainConfig c;
  c.precision = precision;
  c.loss_scaling = loss_scaling;
  return c;
}

TEST(AmpTraining6_MakeScaler, EnabledForFp16OnlyUnlessForced) {
  using amp_training::make_loss_scaler;
  EXPECT_TRUE(make_loss_scaler(config_with(Precision::fp16_mixed, "auto"))->is_enabled());
  EXPECT_FALSE(make_loss_scaler(config_with(Precision::bf16_mixed, "auto"))->is_enabled());
  EXPECT_FALSE(make_loss_scaler(config_with(Precision::fp32, "auto"))->is_enabled());
  EXPECT_FALSE(make_loss_scaler(config_with(Precision::tf32, "auto"))->is_enabled());
  EXPECT_TRUE(make_loss_scaler(config_with(Precision::fp32, "on"))->is_enabled());
  EXPECT_TRUE(make_loss_scaler(config_with(Precision::bf16_mixed, "on"))->is_enabled());
  EXPECT_FALSE(make_loss_scaler(config_with(Precision::fp16_mixed, "off"))->is_enabled());
  EXPECT_TRUE(test::throws_with([] { make_loss_scaler(config_with(Precision::fp16_mixed, "sometimes")); },
                                {"train.loss_scaling", "auto, on, off"}));
}

TEST(AmpTraining6_MakeScaler, KeepsTheConfiguredSettings) {
  auto config = config_with(Precision::fp16_mixed, "auto");
  config.grad_scaler.init_scale = 1024.0;
  config.grad_scaler.growth_interval = 7;
  config.grad_scaler.backoff_factor = 0.25;
  auto scaler = amp_training::make_loss_scaler(config);
  ASSERT_TRUE(scaler->is_enabled());
  auto state = scaler->state();
  EXPECT_EQ(state.scale, 1024.0);
  EXPECT_EQ(state.growth_interval, 7);
  EXPECT_EQ(state.backoff_factor, 0.25);
}

// ---- TODO(amp_training-7): the training step ----------------------------------------------------

// The core trainer's toy problem: 6 features, 3 classes.
struct Toy3 : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  Toy3() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
};

std::shared_ptr<Toy3> copy_of(const Toy3& source) {
  auto copy = std::make_shared<Toy3>();
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < source.parameters().size(); ++i) copy->parameters()[i].copy_(source.parameters()[i]);
  return copy;
}

amplab::LossFn cross_entropy(std::shared_ptr<Toy3> net) {
  return [net](const amplab::Batch& b) { return torch::nn::functional::cross_entropy(net->forward(b.input), b.target); };
}

struct ToyData {
  torch::Tensor x, y;
  explicit ToyData(int64_t n) {
    auto g = at::make_generator<at::CPUGeneratorImpl>(7);
    x = torch::randn({n, 6}, g);
    y = torch::randint(0, 3, {n}, g, torch::kInt64);
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

// The trainer runs your step (it calls amp_training::train_step: amplab/train/step.hpp).
std::unique_ptr<amplab::Trainer> trainer_for(std::shared_ptr<Toy3> net, amplab::LossFn loss, const amplab::TrainConfig& c) {
  return std::make_unique<amplab::Trainer>(net, std::move(loss), c, torch::kCPU);
}

// Six steps in fp32, with and without loss scaling (S a power of two: scaling is exact), equal
// to the plain step written out (loss, backward, SGD step) to the bit.
TEST(AmpTraining7_Step, EqualsThePlainStepWithAndWithoutLossScaling) {
  for (const char* scaling : {"off", "on"}) {
    torch::manual_seed(0);
    ToyData data(48);
    auto mine = std::make_shared<Toy3>();
    auto reference = copy_of(*mine);
    auto trainer = trainer_for(mine, cross_entropy(mine), toy_config(Precision::fp32, scaling));
    torch::optim::SGD sgd(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int step = 0; step < 6; ++step) {
      amplab::Batch batch = data.batch(step, 8);
      amplab::StepResult got = trainer->step(batch);
      sgd.zero_grad();
      torch::Tensor want = cross_entropy(reference)(batch);
      want.backward();
      sgd.step();
      ASSERT_TRUE(got.loss.defined()) << "train_step returned no loss";
      EXPECT_FALSE(got.loss.requires_grad()) << "the returned loss is detached";
      EXPECT_TRUE(test::tensors_equal(got.loss, want.detach())) << scaling << ", loss of step " << step;
      EXPECT_EQ(got.samples, 8);
    }
    for (size_t i = 0; i < reference->parameters().size(); ++i)
      EXPECT_TRUE(test::tensors_equal(mine->parameters()[i], reference->parameters()[i])) << scaling << ", parameter " << i;
  }
}

// bf16-mixed on the CPU: outputs in bf16 under autocast, parameters still fp32, no scaler, the
// loss falls; backward runs outside the autocast region.
TEST(AmpTraining7_Step, RunsTheForwardUnderAutocastAndBackwardOutside) {
  torch::manual_seed(0);
  ToyData data(64);
  auto net = std::make_shared<Toy3>();
  torch::ScalarType seen = torch::kFloat;
  bool backward_under_autocast = true;
  amplab::LossFn loss_fn = [&](const amplab::Batch& b) {
    auto logits = net->forward(b.input);
    seen = logits.scalar_type();
    return torch::nn::functional::cross_entropy(logits, b.target);
  };
  net->fc1->weight.register_hook([&](torch::Tensor grad) {
    backward_under_autocast = at::autocast::is_autocast_enabled(at::kCPU);
    return grad;
  });
  auto trainer = trainer_for(net, loss_fn, toy_config(Precision::bf16_mixed, "auto"));
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    auto r = trainer->step(data.batch(step, 16));
    EXPECT_FALSE(r.skipped.defined()) << "without a scaler there is nothing to skip";
    if (step == 0) first = r.loss.item<double>();
    last = r.loss.item<double>();
  }
  EXPECT_EQ(seen, torch::kBFloat16) << "the forward pass did not run under autocast";
  EXPECT_FALSE(backward_under_autocast) << "close the autocast block before backward";
  EXPECT_EQ(net->fc1->weight.scalar_type(), torch::kFloat) << "parameters stay fp32";
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU)) << "autocast must end with the forward pass";
  EXPECT_LT(last, first * 0.9);
}

// With the scaler on, backward sees gradients S = 65536 times those of the plain loss (a hook
// sees them as they arrive, before any unscaling).
TEST(AmpTraining7_Step, BackwardRunsOnTheScaledLoss) {
  torch::manual_seed(0);
  ToyData data(8);
  auto plain_net = std::make_shared<Toy3>();
  auto scaled_net = copy_of(*plain_net);
  torch::Tensor plain_grad, scaled_grad;
  plain_net->fc2->bias.register_hook([&](torch::Tensor g) { plain_grad = g.clone(); return g; });
  scaled_net->fc2->bias.register_hook([&](torch::Tensor g) { scaled_grad = g.clone(); return g; });
  auto batch = data.batch(0, 8);
  trainer_for(plain_net, cross_entropy(plain_net), toy_config(Precision::fp32, "off"))->step(batch);
  trainer_for(scaled_net, cross_entropy(scaled_net), toy_config(Precision::fp32, "on"))->step(batch);
  ASSERT_TRUE(plain_grad.defined() && scaled_grad.defined()) << "no backward pass ran";
  EXPECT_TRUE(test::tensors_equal(scaled_grad, plain_grad * 65536.0)) << "backward must run on scaler.scale(loss)";
}

// Clipping must see the true gradients: the norm it returns, and the clipped update, are the
// same with loss scaling as without (clipping scaled gradients sees a norm S times too large).
TEST(AmpTraining7_Step, UnscalesBeforeClipping) {
  torch::manual_seed(0);
  ToyData data(8);
  auto plain_net = std::make_shared<Toy3>();
  auto scaled_net = copy_of(*plain_net);
  const double max_norm = 0.05;
  auto batch = data.batch(0, 8);
  auto a = trainer_for(plain_net, cross_entropy(plain_net), toy_config(Precision::fp32, "off", max_norm))->step(batch);
  auto b = trainer_for(scaled_net, cross_entropy(scaled_net), toy_config(Precision::fp32, "on", max_norm))->step(batch);
  ASSERT_TRUE(a.grad_norm.defined() && b.grad_norm.defined()) << "result.grad_norm must be set when clipping";
  double plain_norm = a.grad_norm.item<double>(), scaled_norm = b.grad_norm.item<double>();
  ASSERT_GT(plain_norm, max_norm) << "the test needs a norm that gets clipped";
  EXPECT_NEAR(scaled_norm, plain_norm, 1e-6 * plain_norm)
      << "with loss scaling the clipped norm was " << scaled_norm / plain_norm << " times the true one: unscale first";
  for (size_t i = 0; i < plain_net->parameters().size(); ++i)
    EXPECT_TRUE(test::tensors_close(scaled_net->parameters()[i], plain_net->parameters()[i], 1e-6, 1e-7)) << "parameter " << i;
}

// An overflow skips the step (parameters unchanged), reports it as a device tensor, and the
// scale backs off; clean steps grow it back (growth_interval 2): update() ran every step.
TEST(AmpTraining7_Step, ReportsASkippedStepAndUpdatesTheScale) {
  torch::manual_seed(0);
  ToyData data(16);
  auto net = std::make_shared<Toy3>();
  bool overflow = true;
  amplab::LossFn loss_fn = [&](const amplab::Batch& b) {
    auto loss = torch::nn::functional::cross_entropy(net->forward(b.input), b.target);
    return overflow ? loss * 1e38 : loss;
  };
  auto trainer = trainer_for(net, loss_fn, toy_config(Precision::fp32, "on"));
  auto before = net->fc1->weight.clone();
  auto r = trainer->step(data.batch(0, 8));
  ASSERT_TRUE(r.skipped.defined()) << "with loss scaling, result.skipped must say whether the step was skipped";
  EXPECT_EQ(r.skipped.item<double>(), 1.0);
  EXPECT_TRUE(test::tensors_equal(net->fc1->weight, before)) << "an overflowing step must not change the parameters";
  EXPECT_EQ(trainer->scaler().get_scale(), 32768.0);
  overflow = false;
  r = trainer->step(data.batch(1, 8));
  EXPECT_EQ(r.skipped.item<double>(), 0.0);
  trainer->step(data.batch(0, 8));
  EXPECT_EQ(trainer->scaler().get_scale(), 65536.0) << "after growth_interval clean steps the scale doubles";
}

// ---- TODO(amp_training-8): gradient underflow, measured -----------------------------------------

// A deep, narrow tanh network: its early gradients are small.
struct DeepNarrow : torch::nn::Module {
  std::vector<torch::nn::Linear> layers;
  DeepNarrow() {
    for (int i = 0; i < 8; ++i) layers.push_back(register_module("fc" + std::to_string(i), torch::nn::Linear(32, 32)));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& l : layers) x = torch::tanh(l->forward(x));
    return x;
  }
};

TEST(AmpTraining8_Underflow, Fp32GradientsAreThePlainOnesAndExactScalingChangesNothing) {
  torch::manual_seed(0);
  DeepNarrow net;
  amplab::Batch batch{torch::randn({16, 32}), torch::randint(0, 32, {16}, torch::kInt64)};
  amplab::LossFn loss_fn = [&](const amplab::Batch& b) { return torch::nn::functional::cross_entropy(net.forward(b.input), b.target); };
  auto got = amp_training::gradients_under(net, loss_fn, batch, std::nullopt, 1.0, torch::kCPU);
  auto scaled = amp_training::gradients_under(net, loss_fn, batch, std::nullopt, 1024.0, torch::kCPU);
  for (auto& p : net.parameters()) EXPECT_FALSE(p.grad().defined()) << "the gradients are left cleared";
  net.zero_grad();  // the plain gradients, from cleared ones as gradients_under starts
  loss_fn(batch).backward();
  std::vector<torch::Tensor> plain;
  for (auto& p : net.parameters()) plain.push_back(p.grad().clone());
  ASSERT_EQ(got.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(test::tensors_equal(got[i], plain[i])) << "parameter " << i;
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(test::tensors_equal(scaled[i], plain[i])) << "scaled, parameter " << i;
}

// The loss times 1e-6: in fp16 (CPU autocast runs it too) many gradients flush to zero, with a
// loss scale of 2^16 nearly none do, and bf16, with fp32's range, loses none to underflow.
TEST(AmpTraining8_Underflow, ScalingSavesWhatFp16FlushesToZero) {
  torch::manual_seed(0);
  DeepNarrow net;
  amplab::Batch batch{torch::randn({16, 32}), torch::randint(0, 32, {16}, torch::kInt64)};
  amplab::LossFn tiny = [&](const amplab::Batch& b) {
    return torch::nn::functional::cross_entropy(net.forward(b.input), b.target) * 1e-6;
  };
  auto reference = amp_training::gradients_under(net, tiny, batch, std::nullopt, 1.0, torch::kCPU);
  double fp16 = amp_training::flushed_share(reference, amp_training::gradients_under(net, tiny, batch, torch::kHalf, 1.0, torch::kCPU));
  double scaled = amp_training::flushed_share(reference, amp_training::gradients_under(net, tiny, batch, torch::kHalf, 65536.0, torch::kCPU));
  EXPECT_GT(fp16, 0.2) << "fp16 without loss scaling flushes small gradients to zero";
  EXPECT_LT(scaled, 0.01) << "with the loss scaled by 2^16 they survive";
  EXPECT_LT(scaled, fp16 / 20);
}

TEST(AmpTraining8_Underflow, FlushedShareCountsWhatWasNonZeroAndIsZero) {
  std::vector<torch::Tensor> reference{torch::tensor({1.0f, 0.0f, 2.0f, 3.0f}), torch::tensor({0.0f, 5.0f})};
  std::vector<torch::Tensor> grads{torch::tensor({0.0f, 0.0f, 2.0f, 0.0f}), torch::tensor({7.0f, 5.0f})};
  EXPECT_DOUBLE_EQ(amp_training::flushed_share(reference, grads), 2.0 / 4.0);  // 2 of the 4 non-zero
  EXPECT_DOUBLE_EQ(amp_training::flushed_share({torch::zeros({3})}, {torch::zeros({3})}), 0.0);
  EXPECT_TRUE(test::throws_with([] { amp_training::flushed_share({torch::zeros({3})}, {}); }, {"flushed_share"}));
}

// ---- TODO(amp_training-9): the stretch: skipping on the device ---------------------------------

// PyTorch's fused SGD path: the scaler hands the scale and the inf flag to the kernel, which
// unscales and skips on the device. Same result as unscale_ + SGD up to rounding.
TEST(AmpTraining9_Stretch, AFusedOptimizerSkipsOnTheDevice) {
  torch::manual_seed(3);
  torch::nn::Linear plain(6, 3), fused(6, 3);
  {
    torch::NoGradGuard g;
    fused->weight.copy_(plain->weight);
    fused->bias.copy_(plain->bias);
  }
  auto options = torch::optim::SGDOptions(0.1).momentum(0.9);
  torch::optim::SGD sgd(plain->parameters(), options);
  amplab::FusedSGD fused_sgd(fused->parameters(), options);
  GradScaler a, b;
  EXPECT_TRUE(b.skips_on_device(fused_sgd)) << "an enabled scaler with a fused optimizer can skip on the device";
  EXPECT_FALSE(b.skips_on_device(sgd));
  GradScalerConfig off;
  off.enabled = false;
  EXPECT_FALSE(GradScaler(off).skips_on_device(fused_sgd));
  auto x = torch::randn({5, 6});
  for (int step = 0; step < 4; ++step) {
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
    if (step == 2) EXPECT_TRUE(test::tensors_equal(fused->weight, before));
    a.update();
    b.update();
    EXPECT_EQ(a.get_scale(), b.get_scale());
  }
  EXPECT_TRUE(test::tensors_close(fused->weight, plain->weight, 1e-6, 1e-7));
  EXPECT_TRUE(test::tensors_close(fused->bias, plain->bias, 1e-6, 1e-7));
}

// The inf check before a fused step only reads the gradients, and finds any inf, -inf or NaN,
// in large gradients (2^20 elements and more) as in small ones.
TEST(AmpTraining9_Stretch, TheCheckFindsEveryNonFiniteAndLeavesTheGradients) {
  const int64_t large = int64_t{1} << 20;
  for (float bad : {INFINITY, -INFINITY, NAN}) {
    for (bool in_large : {true, false}) {
      auto big = torch::zeros({large}, torch::requires_grad());
      auto small = torch::zeros({7}, torch::requires_grad());
      amplab::FusedSGD sgd({big, small}, torch::optim::SGDOptions(0.1));
      GradScaler scaler;
      scaler.scale((big.sum() + small.sum()) * 0.5).backward();
      (in_large ? big : small).grad()[in_large ? large - 3 : 4] = bad;
      auto big_grad = big.grad().clone(), small_grad = small.grad().clone();
      scaler.step(sgd);
      EXPECT_EQ(scaler.found_inf().item<double>(), 1.0) << bad << (in_large ? " in the large gradient" : " in the small one");
      EXPECT_TRUE(test::tensors_equal(big.grad(), big_grad));
      EXPECT_TRUE(test::tensors_equal(small.grad(), small_grad));
      EXPECT_EQ(big.abs().max().item<double>(), 0.0);
      scaler.update();
      EXPECT_EQ(scaler.get_scale(), 32768.0);
    }
  }
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

// fp16-mixed through the trainer with your step and scaler: half outputs, the step skipped after
// an overflow, the scale halved, and the loss falls otherwise.
TEST(AmpTrainingGpu, Fp16StepSkipsOverflowsAndLearns_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  torch::Device gpu(torch::kCUDA, 0);
  torch::manual_seed(0);
  auto net = std::make_shared<GpuMlp>();
  net->to(gpu);
  bool overflow = false;
  torch::ScalarType seen = torch::kFloat;
  amplab::LossFn loss_fn = [&](const amplab::Batch& b) {
    auto out = net->forward(b.input);
    seen = out.scalar_type();
    auto loss = torch::nn::functional::cross_entropy(out, b.target);
    return overflow ? loss * 1e38 : loss;
  };
  amplab::TrainConfig c;
  c.precision = Precision::fp16_mixed;
  c.optimizer.lr = 0.01;
  c.optimizer.momentum = 0.9;
  amplab::Trainer trainer(net, loss_fn, c, gpu);
  amplab::Batch batch{torch::randn({64, 256}, gpu), torch::randint(0, 10, {64}, torch::dtype(torch::kInt64).device(gpu))};
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    overflow = step == 2;
    auto before = net->fc1->weight.clone();
    auto got = trainer.step(batch);
    EXPECT_EQ(seen, torch::kHalf);
    ASSERT_TRUE(got.skipped.defined());
    EXPECT_EQ(got.skipped.item<double>(), step == 2 ? 1.0 : 0.0) << "step " << step;
    if (step == 2) {
      EXPECT_TRUE(test::tensors_equal(net->fc1->weight, before));
      EXPECT_EQ(trainer.scaler().get_scale(), 32768.0);
    }
    if (step == 0) first = got.loss.item<double>();
    if (step > 2) last = got.loss.item<double>();
  }
  EXPECT_LT(last, first);
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
  amplab::TrainConfig c;
  c.precision = Precision::bf16_mixed;
  c.optimizer.lr = 0.01;
  c.optimizer.momentum = 0.9;
  amplab::Trainer trainer(net, loss_fn, c, gpu);
  EXPECT_FALSE(trainer.scaler().is_enabled());
  amplab::Batch batch{torch::randn({64, 256}, gpu), torch::randint(0, 10, {64}, torch::dtype(torch::kInt64).device(gpu))};
  double first = trainer.step(batch).loss.item<double>(), last = first;
  for (int i = 0; i < 20; ++i) last = trainer.step(batch).loss.item<double>();
  EXPECT_EQ(seen, torch::kBFloat16);
  EXPECT_EQ(net->fc1->weight.scalar_type(), torch::kFloat);
  EXPECT_LT(last, first);
}

// TODO 1 on a GPU: the scale tensor is made lazily on the loss's device. A scale made on the CPU
// still gives a CUDA scaled loss (a 0-dim CPU tensor broadcasts), but unscale_, the inf check and
// update() then mix devices. found_inf() is made on the scale's device (the reference unscale_),
// so its device is the scale's.
TEST(AmpTrainingGpu, TheScaleIsMadeOnTheLossDevice_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  torch::Device gpu(torch::kCUDA, 0);
  torch::manual_seed(0);
  torch::nn::Linear model(4, 2);
  model->to(gpu);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  GradScaler scaler;
  torch::Tensor loss = model(torch::ones({3, 4}, gpu)).pow(2).mean();
  torch::Tensor scaled = scaler.scale(loss);
  ASSERT_TRUE(scaled.defined());
  EXPECT_EQ(scaled.device(), gpu) << "scale() returned a loss on " << scaled.device() << "; the loss is on " << gpu;
  EXPECT_EQ(scaled.scalar_type(), torch::kFloat);
  EXPECT_TRUE(test::tensors_equal(scaled.cpu(), [&] { return loss.cpu() * 65536.0f; }));
  scaled.backward();
  try {
    scaler.unscale_(sgd);
  } catch (const std::exception& e) {
    FAIL() << "unscale_ failed on " << gpu << " gradients: is the scale tensor scale() made on the loss's device ("
           << gpu << ")? " << e.what();
  }
  EXPECT_TRUE(scaler.step(sgd));
  ASSERT_TRUE(scaler.found_inf().defined());
  EXPECT_EQ(scaler.found_inf().device(), gpu) << "the scale tensor is on " << scaler.found_inf().device()
                                              << ", not on the loss's device " << gpu
                                              << ": make it (and the growth tracker) with the loss's device";
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 65536.0);
}

#if AMPLAB_WITH_CUDA
// CUDA's sync debug mode set to error for its lifetime (torch.cuda.set_sync_debug_mode("error")):
// every operation that makes the host wait for the GPU (.item(), a copy to or from the CPU, a
// stream or device synchronize, nonzero...) throws instead. Restores the mode it found.
struct SyncsAreErrors {
  c10::cuda::SyncDebugMode previous = c10::cuda::warning_state().get_sync_debug_mode();
  SyncsAreErrors() { c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR); }
  ~SyncsAreErrors() { c10::cuda::warning_state().set_sync_debug_mode(previous); }
  SyncsAreErrors(const SyncsAreErrors&) = delete;
  SyncsAreErrors& operator=(const SyncsAreErrors&) = delete;
};
#endif

// TODO 7 on a GPU: train_step never makes the host wait for the GPU (the lab's README: the one
// sync a step may need is the scaler's skip decision, and with a fused optimizer even that stays
// on the device, so a step can be captured as a CUDA graph). fp16 with the scaler (an overflowing
// step included), fp16 with clipping (unscale_, the norm), bf16 without a scaler; fused SGD
// throughout, so the reference's GradScaler::step decides the skip on the device (with a plain
// optimizer it reads found_inf on the host, by design: that sync is the scaler's, not the step's).
// Three warm-up steps run first, outside the check (cuBLAS handles, lazy state).
TEST(AmpTrainingGpu, TheStepNeverSyncsTheHost_CUDA) {
  AMPLAB_REQUIRE_CUDA();
#if !AMPLAB_WITH_CUDA
  GTEST_SKIP() << "LibTorch without CUDA";
#else
  torch::Device gpu(torch::kCUDA, 0);
  struct Case {
    Precision precision;
    double clip;
  };
  for (Case c : {Case{Precision::fp16_mixed, 0.0}, Case{Precision::fp16_mixed, 1.0}, Case{Precision::bf16_mixed, 0.0}}) {
    const std::string where = amplab::to_string(c.precision) + (c.clip > 0 ? " with clipping" : "");
    SCOPED_TRACE(where);
    torch::manual_seed(0);
    auto net = std::make_shared<GpuMlp>();
    net->to(gpu);
    bool overflow = false;
    amplab::LossFn loss_fn = [&](const amplab::Batch& b) {
      auto loss = torch::nn::functional::cross_entropy(net->forward(b.input), b.target);
      return overflow ? loss * 1e38 : loss;
    };
    amplab::TrainConfig config;
    config.precision = c.precision;
    config.grad_clip_norm = c.clip;
    config.optimizer.lr = 0.01;
    config.optimizer.momentum = 0.9;
    config.fast_path = true;  // fused SGD
    config.progress = false;
    amplab::Trainer trainer(net, loss_fn, config, gpu, {}, amplab::make_fast_path_optimizer);
    amplab::Batch batch{torch::randn({64, 256}, gpu), torch::randint(0, 10, {64}, torch::dtype(torch::kInt64).device(gpu))};
    for (int step = 0; step < 3; ++step) {  // warm-up, unchecked
      amp_training::train_step(trainer, batch);
      trainer.optimizer().zero_grad(/*set_to_none=*/true);
    }
    torch::cuda::synchronize();
    std::vector<amplab::StepResult> results;
    for (int step = 0; step < 4; ++step) {
      overflow = step == 1 && trainer.scaler().is_enabled();
      try {
        SyncsAreErrors syncs_are_errors;
        results.push_back(amp_training::train_step(trainer, batch));
      } catch (const c10::Error& e) {
        FAIL() << where << ", step " << step
               << ": the training step synchronized the host with the GPU (an .item(), a CPU copy or a "
                  "non-blocking check): "
               << e.what_without_backtrace();
      }
      trainer.optimizer().zero_grad(/*set_to_none=*/true);
    }
    for (size_t step = 0; step < results.size(); ++step) {
      ASSERT_TRUE(results[step].loss.defined()) << "step " << step;
      EXPECT_TRUE(std::isfinite(results[step].loss.item<double>())) << "step " << step;
      if (trainer.scaler().is_enabled()) {
        ASSERT_TRUE(results[step].skipped.defined()) << "step " << step;
        EXPECT_EQ(results[step].skipped.item<double>(), step == 1 ? 1.0 : 0.0) << "step " << step;
      }
    }
  }
#endif
}

}  // namespace
