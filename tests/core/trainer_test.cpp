// The training step and loop: accumulation equals a big batch, autocast dtypes, loss scaling in
// the step, the divergence guard, exact resume from checkpoints, and metrics files.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <optional>

#include "amplab/fast/fast_path.hpp"
#include "amplab/state/checkpoint.hpp"
#include "amplab/train/checkpointer.hpp"
#include "amplab/train/loop.hpp"
#include "amplab/infra/signals.hpp"
#include "amplab/train/step.hpp"  // lab 2's make_loss_scaler, linked in
#include "amplab/train/trainer.hpp"
#include "support.hpp"

namespace amplab {
namespace {

// Small MLP with dropout, so that resuming must restore the RNG to be exact.
struct Net : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout dropout{nullptr};
  explicit Net(double p = 0.0) {
    fc1 = register_module("fc1", torch::nn::Linear(6, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 3));
    dropout = register_module("dropout", torch::nn::Dropout(p));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(dropout(torch::relu(fc1(x)))); }
};

LossFn cross_entropy(std::shared_ptr<Net> net) {
  return [net](const Batch& b) { return torch::nn::functional::cross_entropy(net->forward(b.input), b.target); };
}

struct ToyData {
  torch::Tensor x, y;
  explicit ToyData(int64_t n, uint64_t seed = 7) {
    auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
    x = torch::randn({n, 6}, g);
    y = torch::randint(0, 3, {n}, g, torch::kInt64);
  }
};

TrainConfig sgd_config(int64_t batch, int accumulation) {
  TrainConfig c;
  c.batch_size = batch;
  c.accumulation_steps = accumulation;
  c.optimizer.lr = 0.1;
  c.optimizer.momentum = 0.9;
  c.progress = false;
  c.log_every = 1000;
  return c;
}

// N micro-batches of B give the same parameters as one batch of N*B. Not bitwise: the big batch
// sums N*B per-sample gradients in one reduction, accumulation sums N partial means, and fp32
// addition is not associative; the difference is a few ulps.
TEST(Trainer, AccumulationMatchesOneBigBatch) {
  torch::manual_seed(0);
  ToyData data(32);
  auto big = std::make_shared<Net>(), small = std::make_shared<Net>();
  {
    torch::NoGradGuard g;
    for (size_t i = 0; i < big->parameters().size(); ++i) small->parameters()[i].copy_(big->parameters()[i]);
  }
  Trainer one(big, cross_entropy(big), sgd_config(16, 1), torch::kCPU);
  Trainer four(small, cross_entropy(small), sgd_config(4, 4), torch::kCPU);
  for (int step = 0; step < 3; ++step) {
    auto x = data.x.narrow(0, step * 8, 16), y = data.y.narrow(0, step * 8, 16);
    one.step(Batch{x, y});
    four.step(MicroBatches{4, [](int64_t) { return int64_t{4}; },
                           [&](int64_t i) { return Batch{x.narrow(0, i * 4, 4), y.narrow(0, i * 4, 4)}; }});
  }
  for (size_t i = 0; i < big->parameters().size(); ++i)
    EXPECT_TRUE(test::tensors_close(small->parameters()[i], big->parameters()[i], 1e-5, 1e-6)) << "parameter " << i;
}

TEST(Trainer, StepReturnsTheMeanLossOnTheDeviceAndClearsGradients) {
  torch::manual_seed(0);
  ToyData data(8);
  auto net = std::make_shared<Net>();
  auto expected = torch::nn::functional::cross_entropy(net->forward(data.x.narrow(0, 0, 4)), data.y.narrow(0, 0, 4)).detach();
  Trainer trainer(net, cross_entropy(net), sgd_config(4, 1), torch::kCPU);
  auto r = trainer.step(Batch{data.x.narrow(0, 0, 4), data.y.narrow(0, 0, 4)});
  EXPECT_TRUE(test::tensors_equal(r.loss, expected));
  EXPECT_FALSE(r.skipped.defined());  // no loss scaling: nothing to skip
  EXPECT_EQ(r.samples, 4);
  EXPECT_EQ(trainer.global_step(), 1);
  for (auto& p : net->parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(Trainer, Bf16MixedOnCpuRunsUnderAutocastWithoutAScaler) {
  torch::manual_seed(0);
  ToyData data(64);
  auto net = std::make_shared<Net>();
  torch::ScalarType seen = torch::kFloat;
  LossFn loss_fn = [&](const Batch& b) {
    auto logits = net->forward(b.input);
    seen = logits.scalar_type();
    return torch::nn::functional::cross_entropy(logits, b.target);
  };
  auto config = sgd_config(16, 1);
  config.precision = Precision::bf16_mixed;
  Trainer trainer(net, loss_fn, config, torch::kCPU);
  EXPECT_FALSE(trainer.scaler().is_enabled());
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    auto r = trainer.step(Batch{data.x.narrow(0, (step % 4) * 16, 16), data.y.narrow(0, (step % 4) * 16, 16)});
    if (step == 0) first = r.loss.item<double>();
    last = r.loss.item<double>();
  }
  EXPECT_EQ(seen, torch::kBFloat16);
  EXPECT_EQ(net->fc1->weight.scalar_type(), torch::kFloat);  // parameters stay fp32
  EXPECT_LT(last, first);
}

TEST(Trainer, RejectsPrecisionTheDeviceCannotRun) {
  auto net = std::make_shared<Net>();
  auto config = sgd_config(4, 1);
  config.precision = Precision::fp16_mixed;
  EXPECT_TRUE(test::throws_with([&] { Trainer t(net, cross_entropy(net), config, torch::kCPU); }, {"fp16-mixed needs a GPU"}));
}

TEST(Trainer, LossScalingSkipsAStepWithInfGradients) {
  torch::manual_seed(0);
  ToyData data(8);
  auto net = std::make_shared<Net>();
  bool poison = true;
  LossFn loss_fn = [&](const Batch& b) {
    auto loss = torch::nn::functional::cross_entropy(net->forward(b.input), b.target);
    return poison ? loss * std::numeric_limits<float>::infinity() : loss;
  };
  auto config = sgd_config(8, 1);
  config.loss_scaling = "on";
  Trainer trainer(net, loss_fn, config, torch::kCPU);
  auto before = net->fc1->weight.clone();
  auto r = trainer.step(Batch{data.x, data.y});
  EXPECT_EQ(r.skipped.item<double>(), 1.0);
  EXPECT_TRUE(test::tensors_equal(net->fc1->weight, before));
  EXPECT_EQ(trainer.scaler().get_scale(), 32768.0);
  poison = false;
  EXPECT_EQ(trainer.step(Batch{data.x, data.y}).skipped.item<double>(), 0.0);
}

TEST(Trainer, ClippingSeesUnscaledGradients) {
  torch::manual_seed(0);
  ToyData data(8);
  auto a = std::make_shared<Net>(), b = std::make_shared<Net>();
  {
    torch::NoGradGuard g;
    for (size_t i = 0; i < a->parameters().size(); ++i) b->parameters()[i].copy_(a->parameters()[i]);
  }
  auto plain = sgd_config(8, 1);
  plain.grad_clip_norm = 0.05;
  auto scaled = plain;
  scaled.loss_scaling = "on";
  Trainer ta(a, cross_entropy(a), plain, torch::kCPU), tb(b, cross_entropy(b), scaled, torch::kCPU);
  auto ra = ta.step(Batch{data.x, data.y});
  auto rb = tb.step(Batch{data.x, data.y});
  EXPECT_NEAR(rb.grad_norm.item<double>(), ra.grad_norm.item<double>(), 1e-6 * ra.grad_norm.item<double>());
  for (size_t i = 0; i < a->parameters().size(); ++i)
    EXPECT_TRUE(test::tensors_close(b->parameters()[i], a->parameters()[i], 1e-6, 1e-7));
}

FitOptions quiet_options() {
  FitOptions o;
  o.lab = "toy";
  o.tag = "t";
  return o;  // no checkpoint (a test that saves says where)
}

// A checkpoint: section handed to fit() as read, its directory never resolved, would save nothing
// and say nothing: fit() refuses it at the start, naming checkpoint.dir and what to call.
TEST(Fit, ACheckpointSectionWithoutItsDirectoryIsRefusedAtTheStart) {
  torch::manual_seed(0);
  ToyData data(16);
  auto net = std::make_shared<Net>();
  Trainer trainer(net, cross_entropy(net), sgd_config(4, 1), torch::kCPU);
  TensorBatches batches(data.x, data.y, EpochSampler(16, 4, 0, true, false), torch::kCPU);
  FitOptions options = quiet_options();
  options.checkpoint = CheckpointConfig{};  // checkpoint.dir: "" as a config file leaves it
  EXPECT_TRUE(test::throws_with([&] { fit(trainer, batches, options); }, {"checkpoint.dir", "Lab::fit_options"}));
  EXPECT_EQ(trainer.global_step(), 0);
}

// Forgets the signal a test raised, so that the next fit() does not stop at once and a second
// raise is not taken for the second Ctrl-C: the handler is removed and installed afresh (a new
// handler starts with no signal).
void forget_interrupt(std::optional<InterruptHandler>& handler) {
  handler.reset();
  handler.emplace();
}

TEST(Loop, DivergenceGuardStopsOnNonFiniteLoss) {
  torch::manual_seed(0);
  ToyData data(64);
  auto net = std::make_shared<Net>();
  LossFn nan_loss = [&](const Batch& b) { return torch::nn::functional::cross_entropy(net->forward(b.input), b.target) * NAN; };
  auto config = sgd_config(4, 1);
  config.divergence_patience = 5;
  config.log_every = 2;
  Trainer trainer(net, nan_loss, config, torch::kCPU);
  TensorBatches batches(data.x, data.y, EpochSampler(64, 4, 0, true, false), torch::kCPU);
  auto result = fit(trainer, batches, quiet_options());
  EXPECT_EQ(result.status, FitStatus::diverged);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.message.find("5 consecutive steps"), std::string::npos) << result.message;
  EXPECT_EQ(trainer.global_step(), 6);  // noticed at the first log point after the 5th
}

// An epoch shorter than the patience whose every loss is NaN is a diverged run, not a success.
TEST(Loop, AnEpochWithoutAFiniteLossFailsWhateverThePatience) {
  torch::manual_seed(0);
  ToyData data(64);
  auto net = std::make_shared<Net>();
  LossFn nan_loss = [&](const Batch& b) { return torch::nn::functional::cross_entropy(net->forward(b.input), b.target) * NAN; };
  auto config = sgd_config(4, 1);
  config.divergence_patience = 1000;  // more than the run's 16 steps
  Trainer trainer(net, nan_loss, config, torch::kCPU);
  TensorBatches batches(data.x, data.y, EpochSampler(64, 4, 0, true, false), torch::kCPU);
  auto result = fit(trainer, batches, quiet_options());
  EXPECT_EQ(result.status, FitStatus::diverged);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_TRUE(test::throws_with([&] { throw Error(result.message); },
                                {"not finite at any of the 16 steps of epoch 1", "train.divergence_patience=1000"}));
}

TEST(Loop, RaggedLastGroupIsAShorterGroup) {
  torch::manual_seed(0);
  ToyData data(40);
  auto net = std::make_shared<Net>();
  auto config = sgd_config(4, 3);  // 10 micro-batches per epoch: groups of 3, 3, 3, 1
  Trainer trainer(net, cross_entropy(net), config, torch::kCPU);
  TensorBatches batches(data.x, data.y, EpochSampler(40, 4, 0, true, false), torch::kCPU);
  auto result = fit(trainer, batches, quiet_options());
  ASSERT_EQ(result.status, FitStatus::completed);
  EXPECT_EQ(result.epochs.at(0).steps, 4);
  EXPECT_EQ(trainer.global_step(), 4);
}

// train.optimizer.schedule=linear: fit() sets lr * (total - step) / total before every step, so
// the run equals stepping by hand with those rates, to the bit (plain and fused SGD).
TEST(Loop, LinearScheduleSetsTheRateOfEveryStep) {
  OptimizerConfig rates;
  rates.lr = 0.2;
  EXPECT_DOUBLE_EQ(scheduled_lr(rates, 5, 10), 0.2);  // constant
  rates.schedule = "linear";
  EXPECT_DOUBLE_EQ(scheduled_lr(rates, 0, 10), 0.2);
  EXPECT_DOUBLE_EQ(scheduled_lr(rates, 5, 10), 0.1);
  EXPECT_DOUBLE_EQ(scheduled_lr(rates, 9, 10), 0.2 * 0.1);
  rates.schedule = "cosine";
  EXPECT_TRUE(test::throws_with([&] { scheduled_lr(rates, 0, 10); }, {"train.optimizer.schedule", "constant, linear"}));

  for (bool fused : {false, true}) {
    torch::manual_seed(0);
    ToyData data(32);
    auto scheduled = std::make_shared<Net>(), by_hand = std::make_shared<Net>();
    {
      torch::NoGradGuard g;
      for (size_t i = 0; i < scheduled->parameters().size(); ++i)
        by_hand->parameters()[i].copy_(scheduled->parameters()[i]);
    }
    auto config = sgd_config(4, 1);
    config.epochs = 2;
    config.fast_path = fused;
    config.optimizer.schedule = "linear";
    Trainer trainer(scheduled, cross_entropy(scheduled), config, torch::kCPU, {}, make_fast_path_optimizer);
    TensorBatches batches(data.x, data.y, EpochSampler(32, 4, 0, /*shuffle=*/false, false), torch::kCPU);
    ASSERT_EQ(fit(trainer, batches, quiet_options()).status, FitStatus::completed);
    EXPECT_DOUBLE_EQ(trainer.optimizer().param_groups()[0].options().get_lr(), 0.1 / 16);  // the last of 16 steps

    auto constant = config;
    constant.optimizer.schedule = "constant";
    Trainer manual(by_hand, cross_entropy(by_hand), constant, torch::kCPU, {}, make_fast_path_optimizer);
    for (int64_t step = 0; step < 16; ++step) {
      set_learning_rate(manual.optimizer(), 0.1 * (static_cast<double>(16 - step) / 16));
      int64_t first = (step % 8) * 4;
      manual.step(Batch{data.x.narrow(0, first, 4), data.y.narrow(0, first, 4)});
    }
    for (size_t i = 0; i < scheduled->parameters().size(); ++i)
      EXPECT_TRUE(test::tensors_equal(scheduled->parameters()[i], by_hand->parameters()[i]))
          << "parameter " << i << (fused ? " (fused SGD)" : " (SGD)");
  }
}

// A run interrupted (SIGINT) after k optimizer steps and resumed from its checkpoint ends bitwise
// equal to an uninterrupted run: parameters, optimizer moments, loss scale, RNG (dropout) and
// data order. Twice: with Adam, and with fused AdamW under a warm-up and linear schedule (its
// step counts live on the device and must reach the checkpoint; the rate must continue).
class ExactResume : public ::testing::TestWithParam<std::tuple<int, bool>> {};

// interrupt_after > 0: a SIGINT arrives during the last micro-batch of that optimizer step.
std::vector<torch::Tensor> train_toy(int64_t interrupt_after, const std::string& checkpoint_dir, const std::string& resume,
                                     bool fused_adamw, std::vector<EpochRecord>* epochs = nullptr) {
  at::globalContext().setDeterministicAlgorithms(true, false);
  torch::set_num_threads(1);
  torch::manual_seed(42);
  ToyData data(40);
  auto net = std::make_shared<Net>(/*dropout=*/0.3);
  auto config = sgd_config(4, 2);  // 10 micro-batches per epoch -> 5 optimizer steps, 15 in all
  config.epochs = 3;
  config.loss_scaling = "on";  // the GradScaler's state must survive too
  config.grad_scaler.init_scale = 1024;
  config.grad_scaler.growth_interval = 3;
  config.optimizer.name = fused_adamw ? "adamw" : "adam";
  config.optimizer.lr = 0.01;
  if (fused_adamw) {
    config.fast_path = true;
    config.optimizer.schedule = "linear";
    config.optimizer.warmup = 0.2;
  }
  std::optional<InterruptHandler> handler(std::in_place);
  int64_t micro_batches = 0;
  LossFn loss = [&, inner = cross_entropy(net)](const Batch& batch) {
    if (++micro_batches == 2 * interrupt_after) std::raise(SIGINT);
    return inner(batch);
  };
  Trainer trainer(net, loss, config, torch::kCPU, {}, make_fast_path_optimizer);
  TensorBatches batches(data.x, data.y, EpochSampler(40, 4, /*seed=*/3, true, false), torch::kCPU);
  FitOptions options = quiet_options();
  if (!checkpoint_dir.empty()) {  // the reference run saves none
    options.checkpoint.emplace().every_epoch = false;  // saves where the test says
    options.checkpoint->dir = checkpoint_dir;
  }
  options.resume = resume;
  options.data_seed = 3;
  auto result = fit(trainer, batches, options);
  forget_interrupt(handler);
  if (epochs) *epochs = result.epochs;
  EXPECT_EQ(result.status, interrupt_after > 0 ? FitStatus::interrupted : FitStatus::completed) << result.message;
  EXPECT_EQ(trainer.global_step(), interrupt_after > 0 ? interrupt_after : 15);
  std::vector<torch::Tensor> out;
  for (auto& p : net->parameters()) out.push_back(p.detach().clone());
  out.push_back(torch::tensor(trainer.scaler().get_scale()));
  return out;
}

TEST_P(ExactResume, InterruptedAndResumedEqualsUninterrupted) {
  const auto [k, fused_adamw] = GetParam();
  test::TempDir dir;
  std::vector<EpochRecord> reference_epochs, resumed_epochs;
  auto reference = train_toy(0, "", "", fused_adamw, &reference_epochs);
  train_toy(k, dir.path().string(), "", fused_adamw);  // stops after k steps with a checkpoint
  auto resumed = train_toy(0, dir.path().string(), "latest", fused_adamw, &resumed_epochs);
  ASSERT_EQ(resumed.size(), reference.size());
  for (size_t i = 0; i < reference.size(); ++i) EXPECT_TRUE(test::tensors_equal(resumed[i], reference[i])) << "tensor " << i;
  // Every epoch is reported, those before the resume too, and the interrupted one's mean loss
  // covers its steps before the interruption as well as after.
  ASSERT_EQ(resumed_epochs.size(), reference_epochs.size());
  for (size_t e = 0; e < reference_epochs.size(); ++e) {
    EXPECT_EQ(resumed_epochs[e].train_loss, reference_epochs[e].train_loss) << "epoch " << e + 1;
    EXPECT_EQ(resumed_epochs[e].steps, reference_epochs[e].steps) << "epoch " << e + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(AtStep, ExactResume, ::testing::Combine(::testing::Values(1, 4, 5, 7, 12), ::testing::Bool()));

// A run resumed from its last checkpoint has nothing left to train: it says so and returns its
// epochs as they were (the MNIST lab crashed on an empty list here).
TEST(Loop, ResumingAFinishedRunTrainsNothingAndKeepsItsEpochs) {
  test::TempDir dir;
  torch::manual_seed(0);
  ToyData data(32);
  auto config = sgd_config(4, 1);
  config.epochs = 2;
  FitOptions options = quiet_options();
  options.checkpoint.emplace().every_epoch = false;  // saves where the test says
  options.checkpoint->every_epoch = true;
  options.checkpoint->dir = dir.path().string();
  auto net = std::make_shared<Net>();
  Trainer trainer(net, cross_entropy(net), config, torch::kCPU);
  TensorBatches batches(data.x, data.y, EpochSampler(32, 4, 0, true, false), torch::kCPU);
  auto first = fit(trainer, batches, options);
  ASSERT_EQ(first.status, FitStatus::completed);

  auto again_net = std::make_shared<Net>();
  Trainer again(again_net, cross_entropy(again_net), config, torch::kCPU);
  options.resume = "latest";
  auto resumed = fit(again, batches, options);
  EXPECT_EQ(resumed.status, FitStatus::completed);
  EXPECT_TRUE(resumed.already_finished);
  EXPECT_EQ(again.global_step(), 16);
  ASSERT_EQ(resumed.epochs.size(), 2u);
  for (size_t e = 0; e < 2; ++e) EXPECT_EQ(resumed.epochs[e].train_loss, first.epochs[e].train_loss);
  for (size_t i = 0; i < net->parameters().size(); ++i)
    EXPECT_TRUE(test::tensors_equal(again_net->parameters()[i], net->parameters()[i]));

  // More epochs train on from there (a constant rate: nothing else changes meaning).
  config.epochs = 3;
  Trainer more(again_net, cross_entropy(again_net), config, torch::kCPU);
  auto longer = fit(more, batches, options);
  EXPECT_EQ(longer.status, FitStatus::completed);
  EXPECT_FALSE(longer.already_finished);
  EXPECT_EQ(longer.epochs.size(), 3u);
  EXPECT_EQ(more.global_step(), 24);
}

// The checkpoint counts its position in samples and records what that position means: a resume
// with another batch size is refused in one line naming the key and both values, and with
// --force goes on from the same sample.
TEST(Loop, ResumeRefusesAChangedBatchSizeUnlessForced) {
  test::TempDir dir;
  torch::manual_seed(0);
  ToyData data(48);
  auto config = sgd_config(4, 1);
  config.epochs = 2;
  FitOptions options = quiet_options();
  options.checkpoint.emplace().every_epoch = false;  // saves where the test says
  options.checkpoint->dir = dir.path().string();
  options.checkpoint->every_steps = 6;  // mid-epoch: 12 steps per epoch
  options.checkpoint->keep_last = 10;
  auto net = std::make_shared<Net>();
  Trainer trainer(net, cross_entropy(net), config, torch::kCPU);
  TensorBatches batches(data.x, data.y, EpochSampler(48, 4, 0, true, false), torch::kCPU);
  ASSERT_EQ(fit(trainer, batches, options).status, FitStatus::completed);
  std::string mid_epoch;
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    if (e.path().filename().string().find("step-00000006") != std::string::npos) mid_epoch = e.path().string();
  ASSERT_FALSE(mid_epoch.empty());
  EXPECT_EQ(read_checkpoint_info(mid_epoch).position.samples, 24);

  auto bigger = config;
  bigger.batch_size = 8;
  auto other = std::make_shared<Net>();
  Trainer changed(other, cross_entropy(other), bigger, torch::kCPU);
  TensorBatches batches8(data.x, data.y, EpochSampler(48, 8, 0, true, false), torch::kCPU);
  options.resume = mid_epoch;
  options.checkpoint->every_steps = 0;
  EXPECT_TRUE(test::throws_with([&] { fit(changed, batches8, options); },
                                {"--resume: train.batch_size is 8 now but was 4", "--force", "sample 24 of epoch 1"}));
  options.force_resume = true;
  auto forced = fit(changed, batches8, options);
  EXPECT_EQ(forced.status, FitStatus::completed) << forced.message;
  // Samples 24..47 of epoch 1 in batches of 8 (3 steps), then all of epoch 2 (6 steps).
  EXPECT_EQ(changed.global_step(), 6 + 3 + 6);
}

// A diverging run never writes a checkpoint with NaN parameters, so the kept ones are good, and
// its message names the last good one.
TEST(Loop, DivergedRunKeepsOnlyGoodCheckpointsAndNamesTheLastOne) {
  test::TempDir dir;
  torch::manual_seed(0);
  ToyData data(64);
  auto net = std::make_shared<Net>();
  int64_t calls = 0;
  LossFn poisoned = [&](const Batch& b) {
    auto loss = torch::nn::functional::cross_entropy(net->forward(b.input), b.target);
    return ++calls > 3 ? loss * NAN : loss;  // NaN from step 4: NaN gradients, NaN parameters
  };
  auto config = sgd_config(4, 1);
  config.divergence_patience = 5;
  config.log_every = 100;
  Trainer trainer(net, poisoned, config, torch::kCPU);
  TensorBatches batches(data.x, data.y, EpochSampler(64, 4, 0, true, false), torch::kCPU);
  FitOptions options = quiet_options();
  options.checkpoint.emplace().every_epoch = false;  // saves where the test says
  options.checkpoint->dir = dir.path().string();
  options.checkpoint->every_steps = 1;
  options.checkpoint->keep_last = 2;
  auto result = fit(trainer, batches, options);
  EXPECT_EQ(result.status, FitStatus::diverged);
  EXPECT_TRUE(test::throws_with([&] { throw Error(result.message); }, {"consecutive steps", "the last good checkpoint is", "step-00000003.ckpt", "(step 3)"}));
  int checked = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    if (e.path().extension() != ".ckpt") continue;
    auto fresh = std::make_shared<Net>();
    auto optimizer = make_optimizer(fresh->parameters(), config.optimizer);
    auto scaler = amp_training::make_loss_scaler(config);
    TrainingState state{*fresh, *optimizer, *scaler};
    load_checkpoint(e.path().string(), state, "toy");
    for (const auto& p : fresh->parameters()) EXPECT_TRUE(p.isfinite().all().item<bool>()) << e.path();
    ++checked;
  }
  EXPECT_EQ(checked, 2);
}

// With checkpoint.on_interrupt=false a Ctrl-C saves nothing, and says so: which checkpoint is
// the last and that the steps after it are lost. A signal during the last evaluation stops at
// the end of training, with its final checkpoint, instead of promising one that never comes.
TEST(Loop, InterruptMessagesSayWhatWasSavedAndWhatIsLost) {
  test::TempDir dir;
  torch::manual_seed(0);
  ToyData data(32);
  auto net = std::make_shared<Net>();
  std::optional<InterruptHandler> handler(std::in_place);
  int64_t calls = 0;
  LossFn loss = [&, inner = cross_entropy(net)](const Batch& b) {
    if (++calls == 6) std::raise(SIGINT);
    return inner(b);
  };
  auto config = sgd_config(4, 1);
  config.epochs = 2;
  Trainer trainer(net, loss, config, torch::kCPU);
  TensorBatches batches(data.x, data.y, EpochSampler(32, 4, 0, true, false), torch::kCPU);
  FitOptions options = quiet_options();
  options.checkpoint.emplace().every_epoch = false;  // saves where the test says
  options.checkpoint->dir = dir.path().string();
  options.checkpoint->every_steps = 4;
  options.checkpoint->on_interrupt = false;
  auto result = fit(trainer, batches, options);
  forget_interrupt(handler);
  EXPECT_EQ(result.status, FitStatus::interrupted);
  EXPECT_TRUE(test::throws_with([&] { throw Error(result.message); },
                                {"interrupted at epoch 1 step 6", "no checkpoint saved (checkpoint.on_interrupt=false)",
                                 "step-00000004.ckpt' at step 4, so the steps after it are lost", "resume with --resume"}));

  test::TempDir final_dir;
  auto last_net = std::make_shared<Net>();
  Trainer last(last_net, cross_entropy(last_net), config, torch::kCPU);
  FitOptions at_end = quiet_options();
  at_end.checkpoint.emplace().dir = final_dir.path().string();  // saves at every epoch's end
  at_end.evaluate = [](int64_t epoch) {
    if (epoch == 2) std::raise(SIGINT);  // during the evaluation after the last step
    return nlohmann::json::object();
  };
  auto finished = fit(last, batches, at_end);
  forget_interrupt(handler);
  EXPECT_EQ(finished.status, FitStatus::interrupted);
  EXPECT_EQ(finished.epochs.size(), 2u);
  EXPECT_TRUE(test::throws_with([&] { throw Error(finished.message); },
                                {"after its last step: training had finished", "checkpoint saved to", "step-00000016.ckpt"}));
}

TEST(Loop, ABatchLargerThanTheTrainingSetIsRefused) {
  ToyData data(10);
  auto net = std::make_shared<Net>();
  auto config = sgd_config(16, 1);
  Trainer trainer(net, cross_entropy(net), config, torch::kCPU);
  TensorBatches ragged(data.x, data.y, EpochSampler(10, 16, 0, true, /*drop_last=*/false), torch::kCPU);
  EXPECT_TRUE(test::throws_with([&] { fit(trainer, ragged, quiet_options()); },
                                {"train.batch_size=16 is larger than the training set (10 samples)"}));
  config.drop_last = true;
  Trainer dropping(net, cross_entropy(net), config, torch::kCPU);
  TensorBatches none(data.x, data.y, EpochSampler(10, 16, 0, true, /*drop_last=*/true), torch::kCPU);
  EXPECT_TRUE(test::throws_with([&] { fit(dropping, none, quiet_options()); }, {"leaves no batch", "train.drop_last"}));
}

TEST(Loop, WritesMetricsAndStepsCsv) {
  test::TempDir dir;
  RunConfig run;
  run.out_dir = dir.path().string();
  run.log_level = log::Level::warn;
  RunDir run_dir = RunDir::create(run, "toy", "x: 1\n");
  torch::manual_seed(0);
  ToyData data(32);
  auto net = std::make_shared<Net>();
  auto config = sgd_config(8, 1);
  config.epochs = 2;
  config.log_every = 2;
  Trainer trainer(net, cross_entropy(net), config, torch::kCPU);
  TensorBatches batches(data.x, data.y, EpochSampler(32, 8, 0, true, false), torch::kCPU);
  FitOptions options = quiet_options();
  options.run_dir = &run_dir;
  options.evaluate = [](int64_t epoch) { return nlohmann::json{{"test_accuracy", 0.5 + 0.1 * epoch}}; };
  auto result = fit(trainer, batches, options);
  ASSERT_EQ(result.epochs.size(), 2u);
  std::ifstream metrics(run_dir.file("metrics.csv"));
  std::string header, row1, row2;
  std::getline(metrics, header);
  std::getline(metrics, row1);
  std::getline(metrics, row2);
  EXPECT_EQ(header, "tag,epoch,train_loss,seconds,samples_per_s,steps,skipped_steps,loss_scale,test_accuracy");
  EXPECT_EQ(row2.substr(0, 4), "t,2,");
  EXPECT_NE(row2.find("0.700000"), std::string::npos) << row2;
  EXPECT_TRUE(std::filesystem::exists(run_dir.file("steps.csv")));
  EXPECT_TRUE(std::filesystem::exists(run_dir.file("config.yaml")));
  log::init(log::Level::info);
}

// Two runs of different run.out_dir sharing one checkpoint.dir: `--resume latest` of each goes on
// from its own checkpoint (the pointer lives beside its run directories), not from the one the
// other wrote last into the shared directory.
TEST(Loop, LatestStaysWithTheRunsThatWroteIt) {
  test::TempDir dir;
  torch::manual_seed(0);
  ToyData data(32);
  TensorBatches batches(data.x, data.y, EpochSampler(32, 4, 0, true, false), torch::kCPU);
  auto train = [&](const std::string& out_dir, int epochs, const std::string& resume) {
    RunConfig run;
    run.out_dir = dir.file(out_dir);
    run.log_level = log::Level::warn;
    RunDir run_dir = RunDir::create(run, "toy", "x: 1\n");
    auto config = sgd_config(4, 1);
    config.epochs = epochs;
    auto net = std::make_shared<Net>();
    Trainer trainer(net, cross_entropy(net), config, torch::kCPU);
    FitOptions options = quiet_options();
    options.checkpoint.emplace().every_epoch = false;  // saves where the test says
    options.checkpoint->every_epoch = true;
    options.checkpoint->dir = dir.file("shared_checkpoints");
    options.run_dir = &run_dir;
    options.resume = resume;
    return fit(trainer, batches, options);
  };
  const FitResult a = train("a", 1, ""), b = train("b", 2, "");  // b writes last, at step 16
  ASSERT_FALSE(a.last_checkpoint.empty());
  ASSERT_FALSE(b.last_checkpoint.empty());
  EXPECT_TRUE(std::filesystem::exists(dir.file("a/toy/latest")));
  EXPECT_TRUE(std::filesystem::exists(dir.file("b/toy/latest")));
  const FitResult resumed_a = train("a", 1, "latest"), resumed_b = train("b", 2, "latest");
  EXPECT_TRUE(resumed_a.already_finished);
  EXPECT_TRUE(std::filesystem::equivalent(resumed_a.last_checkpoint, a.last_checkpoint)) << resumed_a.last_checkpoint;
  EXPECT_EQ(resumed_a.position.global_step, 8);
  EXPECT_TRUE(std::filesystem::equivalent(resumed_b.last_checkpoint, b.last_checkpoint)) << resumed_b.last_checkpoint;
  EXPECT_EQ(resumed_b.position.global_step, 16);
  // Without a run directory the checkpoint directory's own `latest` is read: the newest file there.
  auto net = std::make_shared<Net>();
  auto config = sgd_config(4, 1);
  config.epochs = 2;
  Trainer trainer(net, cross_entropy(net), config, torch::kCPU);
  FitOptions options = quiet_options();
  options.checkpoint.emplace().every_epoch = false;  // saves where the test says
  options.checkpoint->dir = dir.file("shared_checkpoints");
  options.resume = "latest";
  EXPECT_TRUE(std::filesystem::equivalent(fit(trainer, batches, options).last_checkpoint, b.last_checkpoint));
  log::init(log::Level::info);
}

// The loop's part of a checkpoint as earlier builds wrote it, by hand: the same keys, a NaN loss as
// null. It reads into LoopState and writes back the same; a state without any of its keys reads
// as empty (files of builds before the settings and sums were kept).
TEST(Loop, LoopStateReadsWhatEarlierBuildsWrote) {
  const std::string earlier =
      R"({"epochs":[{"epoch":1,"eval":{"test_accuracy":0.5},"loss_scale":1.0,"samples_per_second":10.0,)"
      R"("seconds":2.0,"skipped_steps":0,"steps":8,"tag":"t","train_loss":null}],"settings":{"batch_size":4},)"
      R"("sums":{"loss_count":3,"loss_sum":1.5,"samples":12,"seconds":0.5,"skipped":1,"steps":3}})";
  const LoopState state = nlohmann::json::parse(earlier).get<LoopState>();
  ASSERT_EQ(state.epochs.size(), 1u);
  EXPECT_TRUE(std::isnan(state.epochs[0].train_loss));
  EXPECT_EQ(state.epochs[0].steps, 8);
  EXPECT_EQ(state.epochs[0].eval.value("test_accuracy", 0.0), 0.5);
  EXPECT_EQ(state.sums.loss_count, 3);
  EXPECT_EQ(state.sums.skipped, 1);
  ASSERT_EQ(state.settings.list.size(), 1u);
  EXPECT_EQ(state.settings.list[0].name, "batch_size");
  EXPECT_EQ(nlohmann::json::parse(nlohmann::json(state).dump()), nlohmann::json::parse(earlier));
  const LoopState bare = nlohmann::json::object().get<LoopState>();
  EXPECT_TRUE(bare.epochs.empty());
  EXPECT_TRUE(bare.settings.list.empty());
  EXPECT_EQ(bare.sums.steps, 0);
}

}  // namespace
}  // namespace amplab
