// amplab::FusedAdamW and the learning-rate schedule against PyTorch: a recorded CPU run of
// torch.optim.AdamW(fused=True) under a GradScaler and a LambdaLR (tests/fixtures/
// make_fused_adamw_golden.py) replayed step by step, equal to the last bit.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "amplab/infra/error.hpp"
#include "amplab/fast/fast_path.hpp"
#include "amplab/fast/fused_adamw.hpp"
#include "amplab/fast/fused_fp8_mlp.hpp"
#include "amplab/fast/fused_mnist_net.hpp"
#include "amplab/fast/fused_residual_norm.hpp"
#include "amplab/fast/fused_sgd.hpp"
#if AMPLAB_WITH_CUDA
#include "amplab/fast/cuda/fused_adamw_launch.hpp"
#endif
#include "amplab/train/trainer.hpp"
#include "grad_scaler.hpp"  // lab 2's (the reference here)
#include "support.hpp"

namespace amplab {
namespace {

// The golden tests replay fixtures recorded by PyTorch to the last bit. Both sides pin the CPU
// kernels: ATen's scalar ones and MKL's SSE2 path (conditional bitwise reproducibility), as
// tests/fixtures/make_*_golden.py do, so that the bits do not depend on the machine's vector
// units (AVX2 and AVX-512 kernels sum in other orders). Set before main(), before any torch op
// or MKL call reads them, for the whole core_test process.
const bool kCpuKernelsPinned = [] {
  setenv("ATEN_CPU_CAPABILITY", "default", /*overwrite=*/1);
  setenv("MKL_CBWR", "COMPATIBLE", 1);
  return true;
}();

class FusedAdamWGolden : public ::testing::TestWithParam<int> {};

// One thread on both sides: the same kernels from the same libtorch run in the same order.
TEST_P(FusedAdamWGolden, ReplaysPyTorchToTheLastBit) {
  torch::set_num_threads(1);
  auto golden = test::load_fixture("fused_adamw_golden.json");
  const auto& s = golden.at("scenarios").at(GetParam());
  SCOPED_TRACE(s.at("name").get<std::string>());

  torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 4));
  auto params = model->parameters();
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(test::tensor_from_bits(s.at("initial_params")[i]));
  }
  torch::Tensor xs = test::tensor_from_bits(s.at("x")), ys = test::tensor_from_bits(s.at("y"));
  auto betas = s.at("betas").get<std::vector<double>>();
  FusedAdamW optimizer(params, torch::optim::AdamWOptions(s.at("lr").get<double>())
                                   .betas({betas[0], betas[1]})
                                   .weight_decay(s.at("weight_decay").get<double>())
                                   .amsgrad(s.at("amsgrad").get<bool>()));
  OptimizerConfig schedule;
  schedule.lr = s.at("lr").get<double>();
  schedule.schedule = s.at("schedule").get<std::string>();
  schedule.warmup = s.at("warmup").get<double>();
  GradScalerConfig scaler_config;
  scaler_config.enabled = s.at("scaler").get<bool>();
  scaler_config.init_scale = 256.0;
  scaler_config.growth_interval = 3;
  amp_training::GradScaler scaler(scaler_config);

  const int64_t steps = s.at("steps").get<int64_t>();
  for (int64_t step = 0; step < steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const double lr = scheduled_lr(schedule, step, steps);
    EXPECT_EQ(lr, std::stod(s.at("trace")[step].at("lr").get<std::string>()));  // LambdaLR's rate, to the bit
    optimizer.set_lr(lr);
    optimizer.zero_grad(/*set_to_none=*/true);
    scaler.scale(torch::mse_loss(model->forward(xs[step]), ys[step])).backward();
    if (auto it = s.at("injections").find(std::to_string(step)); it != s.at("injections").end()) {
      torch::NoGradGuard no_grad;
      params[(*it)[1].get<size_t>()].grad().view(-1)[(*it)[2].get<int64_t>()] = (*it)[0] == "nan" ? NAN : INFINITY;
    }
    scaler.step(optimizer);
    scaler.update();
  }
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);  // copies the step counts into torch::optim::AdamW's state
  for (size_t i = 0; i < params.size(); ++i) {
    SCOPED_TRACE("parameter " + std::to_string(i));
    auto& state = static_cast<torch::optim::AdamWParamState&>(*optimizer.state().at(params[i].unsafeGetTensorImpl()));
    EXPECT_TRUE(test::tensors_equal(params[i], test::tensor_from_bits(s.at("final_params")[i])));
    EXPECT_TRUE(test::tensors_equal(state.exp_avg(), test::tensor_from_bits(s.at("final_exp_avg")[i])));
    EXPECT_TRUE(test::tensors_equal(state.exp_avg_sq(), test::tensor_from_bits(s.at("final_exp_avg_sq")[i])));
    EXPECT_EQ(state.step(), s.at("final_step")[i].get<int64_t>());  // skipped steps do not count
  }
}

INSTANTIATE_TEST_SUITE_P(Scenarios, FusedAdamWGolden, ::testing::Values(0, 1));

TEST(Schedule, WarmupThenLinearOrConstant) {
  OptimizerConfig c;
  c.lr = 0.4;
  EXPECT_FALSE(has_schedule(c));
  c.warmup = 0.25;  // 2 of 8 steps
  EXPECT_TRUE(has_schedule(c));
  std::vector<double> constant, linear;
  for (int64_t t = 0; t < 8; ++t) constant.push_back(scheduled_lr(c, t, 8));
  c.schedule = "linear";
  for (int64_t t = 0; t < 8; ++t) linear.push_back(scheduled_lr(c, t, 8));
  EXPECT_EQ(constant, (std::vector<double>{0.0, 0.2, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4}));
  EXPECT_EQ(linear, (std::vector<double>{0.0, 0.2, 0.4, 0.4 * (5.0 / 6), 0.4 * (4.0 / 6), 0.4 * (3.0 / 6), 0.4 * (2.0 / 6), 0.4 * (1.0 / 6)}));
  c.warmup = 0.1;  // floor(0.8) = 0 warm-up steps: plain linear decay
  EXPECT_EQ(scheduled_lr(c, 0, 8), 0.4);
}

#if AMPLAB_WITH_CUDA
// On a GPU FusedAdamW runs PyTorch's kernel over chunks sized so that one launch of at most 320
// blocks holds the model: the MNIST network's 1.2 M parameters get 4096-element chunks (~300
// blocks instead of 20); a model too big for that keeps PyTorch's 65536.
TEST(FusedAdamW, ChunksAreSizedToFillTheGpu) {
  EXPECT_EQ(cuda::adamw_chunk_size({288, 32, 18432, 64, 1179648, 128, 1280, 10}), 4096);
  EXPECT_EQ(cuda::adamw_chunk_size({10, 7}), 2048);
  EXPECT_EQ(cuda::adamw_chunk_size({int64_t{8192} * 8192, 8192}), 65536);
}
#endif

TEST(FusedAdamW, CheckpointStateLoadsIntoPlainAdamWAndBack) {
  torch::manual_seed(5);
  auto w = torch::randn({6}, torch::requires_grad());
  FusedAdamW fused({w}, torch::optim::AdamWOptions(0.1));
  for (int i = 0; i < 3; ++i) {
    fused.zero_grad();
    w.pow(2).sum().backward();
    fused.step();
  }
  torch::serialize::OutputArchive out;
  fused.save(out);
  std::stringstream bytes;
  out.save_to(bytes);

  // Plain AdamW continues from the fused state exactly where fused AdamW would (same step count).
  auto w_plain = w.detach().clone().requires_grad_(true), w_fused = w.detach().clone().requires_grad_(true);
  torch::optim::AdamW plain({w_plain}, torch::optim::AdamWOptions(0.1));
  FusedAdamW again({w_fused}, torch::optim::AdamWOptions(0.1));
  for (torch::optim::Optimizer* o : {static_cast<torch::optim::Optimizer*>(&plain), static_cast<torch::optim::Optimizer*>(&again)}) {
    torch::serialize::InputArchive in;
    bytes.seekg(0);
    in.load_from(bytes);
    o->load(in);
  }
  for (auto [param, optimizer] : {std::pair<torch::Tensor, torch::optim::Optimizer*>{w_plain, &plain}, {w_fused, &again}}) {
    optimizer->zero_grad();
    param.pow(2).sum().backward();
    optimizer->step();
  }
  EXPECT_EQ(static_cast<torch::optim::AdamWParamState&>(*plain.state().at(w_plain.unsafeGetTensorImpl())).step(), 4);
  EXPECT_TRUE(test::tensors_close(w_fused, w_plain, 1e-6, 1e-7));
}

// train.fast_path picks PyTorch's fused SGD and AdamW, and refuses an optimizer without a fused
// kernel in one line naming both keys; off, the optimizers are torch::optim's.
TEST(FastPath, FusedOptimizersForSgdAndAdamwOnly) {
  TrainConfig c;
  c.fast_path = true;
  c.optimizer.name = "adam";
  auto w = torch::zeros({2}, torch::requires_grad());
  EXPECT_TRUE(test::throws_with([&] { make_fast_path_optimizer({w}, c); },
                                {"train.fast_path", "train.optimizer.name 'adam'", "only sgd and adamw"}));
  c.optimizer.name = "adamw";
  EXPECT_NE(dynamic_cast<FusedAdamW*>(make_fast_path_optimizer({w}, c).get()), nullptr);
  c.optimizer.name = "sgd";
  EXPECT_NE(dynamic_cast<FusedSGD*>(make_fast_path_optimizer({w}, c).get()), nullptr);
  c.fast_path = false;
  auto plain = make_fast_path_optimizer({w}, c);
  EXPECT_NE(dynamic_cast<torch::optim::SGD*>(plain.get()), nullptr);
  EXPECT_EQ(dynamic_cast<FusedOptimizer*>(plain.get()), nullptr);
  c.optimizer.name = "adam";
  EXPECT_NE(dynamic_cast<torch::optim::Adam*>(make_fast_path_optimizer({w}, c).get()), nullptr);
}

// The teaching core's rooms and the labs never include the fast path: a lab's program composes it.
TEST(FastPath, NoTeachingRoomIncludesIt) {
  namespace fs = std::filesystem;
  const fs::path root = AMPLAB_SOURCE_DIR;
  std::string found;
  for (const char* room : {"src/amplab/infra", "src/amplab/measure", "src/amplab/report", "src/amplab/state",
                           "src/amplab/models", "src/amplab/train", "src/amplab/data", "src/amplab/dist", "labs"}) {
    for (const auto& entry : fs::recursive_directory_iterator(root / room)) {
      if (!entry.is_regular_file()) continue;
      std::ifstream in(entry.path());
      for (std::string line; std::getline(in, line);)
        if (line.find("#include") != std::string::npos && line.find("amplab/fast/") != std::string::npos)
          found += entry.path().lexically_relative(root).string() + ": " + line + "\n";
    }
  }
  EXPECT_TRUE(found.empty()) << found;
}

// A trainer handed no optimizer of the fast path refuses the key instead of running without it.
TEST(FastPath, TrainerWithoutTheFastPathsOptimizerRefusesTheKey) {
  torch::nn::Linear model(2, 1);
  TrainConfig c;
  c.fast_path = true;
  LossFn loss = [model](const Batch& b) mutable { return model(b.input).sum(); };
  EXPECT_TRUE(test::throws_with([&] { Trainer t(model.ptr(), loss, c, torch::kCPU); },
                                {"train.fast_path", "make_fast_path_optimizer", "train.fast_path=false"}));
  Trainer fast(model.ptr(), loss, c, torch::kCPU, {}, make_fast_path_optimizer);
  EXPECT_NE(dynamic_cast<FusedSGD*>(&fast.optimizer()), nullptr);
}

// Off a GPU the residual step is PyTorch's ops: x + dropout(branch) and its LayerNorm, values and
// gradients to the bit (without dropout), and with dropout each element either dropped or scaled.
TEST(FastPath, ResidualNormOffTheGpuIsPyTorchsOps) {
  torch::manual_seed(0);
  const auto x0 = torch::randn({3, 5, 8}), branch0 = torch::randn({3, 5, 8}), weight0 = torch::rand({8}) + 0.5;
  EXPECT_FALSE(dropout_add_layer_norm_runs_fused(x0, branch0, weight0));
  std::vector<torch::Tensor> grads[2], outputs[2];
  for (int ours : {0, 1}) {
    auto x = x0.clone().requires_grad_(true), branch = branch0.clone().requires_grad_(true);
    auto weight = weight0.clone().requires_grad_(true);
    torch::Tensor sum, normed;
    if (ours == 1) {
      std::tie(sum, normed) = dropout_add_layer_norm(x, branch, weight, 0.0);
    } else {
      sum = x + branch;
      normed = torch::layer_norm(sum, {8}, weight, {}, 1e-5);
    }
    (sum.sum() + (normed * normed).sum()).backward();
    outputs[ours] = {sum, normed};
    grads[ours] = {x.grad(), branch.grad(), weight.grad()};
  }
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(test::tensors_equal(outputs[1][i], outputs[0][i])) << i;
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(test::tensors_equal(grads[1][i], grads[0][i])) << i;
  auto [sum, normed] = dropout_add_layer_norm(x0, branch0, weight0, 0.5);
  const auto kept = (sum - x0 - branch0 * 2).abs() < 1e-5, dropped = (sum - x0).abs() < 1e-7;
  EXPECT_TRUE((kept | dropped).all().item<bool>());
  EXPECT_TRUE(kept.any().item<bool>() && dropped.any().item<bool>());
  auto [first, first_normed] = dropout_add_layer_norm({}, branch0.to(torch::kBFloat16), weight0, 0.0);  // no residual yet
  EXPECT_EQ(first.scalar_type(), torch::kFloat);
  EXPECT_TRUE(test::tensors_equal(first, branch0.to(torch::kBFloat16).to(torch::kFloat)));
}

// The fast path's FP8 MLP off a GPU (PyTorch's ops, the reference its kernels are held to): each
// tensor's scale comes from the largest amax of its past `history` steps, the first step's from
// its own; the output and gradients are FP8's rounding of the float32 MLP's; bad shapes are refused.
TEST(FastPath, Fp8MlpScalesFromThePastStepsAmaxes) {
  torch::manual_seed(0);
  const auto x0 = torch::randn({32, 64});
  std::vector<torch::Tensor> weights = {(torch::randn({48, 64}) * 0.1).requires_grad_(true),
                                        (torch::randn({32, 48}) * 0.1).requires_grad_(true)};
  Fp8ReluMlp mlp(/*history=*/2);
  std::vector<double> amax, x_scale;
  for (double range : {1.0, 4.0, 1.0, 1.0, 1.0}) {
    const auto x = x0 * range;
    mlp.forward(x, weights).sum().backward();
    amax.push_back(x.to(torch::kBFloat16).abs().max().item<double>());
    x_scale.push_back(mlp.scales()[0][0].item<double>());
    EXPECT_FLOAT_EQ(mlp.scales()[1][0].item<float>(), 448 / weights[0].abs().max().item<float>()) << "the weight's";
    EXPECT_FLOAT_EQ(mlp.scales()[5][0].item<float>(), 57344) << "the last gradient's: its amax is 1";
  }
  const std::vector<double> expected = {448 / amax[0], 448 / amax[0], 448 / amax[1], 448 / amax[1], 448 / amax[0]};
  for (size_t k = 0; k < expected.size(); ++k) EXPECT_FLOAT_EQ(x_scale[k], expected[k]) << "step " << k;

  for (auto& w : weights) w.mutable_grad() = torch::Tensor();
  const auto x = x0.clone().requires_grad_(true);
  const auto y = Fp8ReluMlp().forward(x, weights);  // a fresh state: this loss's gradients have their own range
  y.to(torch::kFloat32).pow(2).sum().backward();
  std::vector<torch::Tensor> ours = {y.to(torch::kFloat32), x.grad(), weights[0].grad(), weights[1].grad()};
  auto x32 = x0.clone().requires_grad_(true);
  std::vector<torch::Tensor> w32 = {weights[0].detach().clone().requires_grad_(true),
                                    weights[1].detach().clone().requires_grad_(true)};
  const auto y32 = torch::relu(torch::relu(x32.matmul(w32[0].t())).matmul(w32[1].t()));
  y32.pow(2).sum().backward();
  const std::vector<torch::Tensor> reference = {y32, x32.grad(), w32[0].grad(), w32[1].grad()};
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_EQ(ours[i].sizes(), reference[i].sizes()) << i;
    const double error = ((ours[i] - reference[i]).norm() / reference[i].norm()).item<double>();
    EXPECT_LT(error, 0.15) << "tensor " << i << " (y, x's grad, the weights' grads): FP8 rounds, it does not reorder";
  }
  EXPECT_THROW(mlp.forward(x0.reshape({8, 4, 64}), weights), Error);
  EXPECT_THROW(mlp.forward(x0, {weights[0]}), Error) << "one MLP, one state: another layer count";
  EXPECT_THROW(Fp8ReluMlp().forward(torch::randn({32, 60}), {torch::randn({48, 60})}), Error) << "60 is no multiple of 16";
  EXPECT_THROW(Fp8ReluMlp().forward(x0, {weights[1]}), Error) << "the weight's columns are not x's";
}

// The fused MNIST network is a MnistNet with the same parameters under the same names (so
// checkpoints and safetensors files go from one to the other), and off a GPU the same values.
TEST(FastPath, FusedMnistNetHasTheTextbookParametersAndValues) {
  TrainConfig c;
  c.fast_path = true;
  torch::manual_seed(0);
  MnistNet fused = make_mnist_net(c);
  c.fast_path = false;
  MnistNet textbook = make_mnist_net(c);
  EXPECT_NE(dynamic_cast<FusedMnistNetImpl*>(fused.get()), nullptr);
  EXPECT_EQ(dynamic_cast<FusedMnistNetImpl*>(textbook.get()), nullptr);
  auto fused_params = fused->named_parameters(), textbook_params = textbook->named_parameters();
  ASSERT_EQ(fused_params.size(), textbook_params.size());
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < fused_params.size(); ++i) {
    EXPECT_EQ(fused_params[i].key(), textbook_params[i].key());
    EXPECT_EQ(fused_params[i].value().sizes(), textbook_params[i].value().sizes());
    textbook_params[i].value().copy_(fused_params[i].value());
  }
  fused->eval();
  textbook->eval();
  auto x = torch::randn({4, 1, 28, 28});
  EXPECT_TRUE(test::tensors_equal(fused->forward(x), textbook->forward(x)));
}

// On the CPU the fast path runs eagerly (CUDA graphs need a GPU), and the log line says which
// path runs and why.
TEST(FastPath, StepsOnTheCpuAreEagerAndTheLineSaysWhy) {
  TrainConfig c;
  c.optimizer.name = "adamw";
  for (bool fast : {true, false}) {
    c.fast_path = fast;
    MnistNet net = make_mnist_net(c);
    Trainer trainer(net.ptr(), [&](const Batch& b) { return torch::nll_loss(net->forward(b.input), b.target); }, c,
                    torch::kCPU, {}, make_fast_path_optimizer);
    FastPathSteps steps = fast_path_steps(trainer);
    EXPECT_FALSE(steps.run_step);
    if (fast)
      EXPECT_EQ(steps.description, "fast path on (train.fast_path): FusedMnistNet (torch's ops off a GPU), fused adamw, "
                                   "eager steps (CUDA graphs need a GPU)");
    else
      EXPECT_EQ(steps.description, "fast path off: MnistNet (the textbook layers), torch::optim adamw, eager steps");
  }
}

}  // namespace
}  // namespace amplab
