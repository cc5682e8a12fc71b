// The memory levers of the core: activation checkpointing (gradients equal to the plain ones, to
// the bit on the CPU, with dropout and autocast; parameter gradients through AccumulateGrad; less
// memory, counted exactly by wrapping torch's CPU allocator), the batch-size finder driven by a
// fake memory limit (answers, restored state), and the out-of-memory helpers.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function_hook.h>

#include <fstream>

#include "amplab/activation_checkpoint.hpp"
#include "amplab/batch_finder.hpp"
#include "amplab/error.hpp"
#include "amplab/memory.hpp"
#include "amplab/precision.hpp"
#include "support.hpp"

namespace amplab {
namespace {

// Same parameters, a different module.
torch::nn::Sequential copy_blocks(const torch::nn::Sequential& from, int64_t depth, int64_t width, double p) {
  auto to = test::residual_mlp_blocks(depth, width, p);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < from->parameters().size(); ++i) to->parameters()[i].copy_(from->parameters()[i]);
  return to;
}

void expect_same_grads(const torch::nn::Module& got, const torch::nn::Module& want, const std::string& where) {
  auto g = got.named_parameters();
  for (const auto& item : want.named_parameters()) {
    ASSERT_TRUE(g[item.key()].grad().defined()) << where << ": no gradient for " << item.key();
    EXPECT_TRUE(test::tensors_equal(g[item.key()].grad(), item.value().grad())) << where << ": " << item.key();
  }
}

// ---- checkpointing ------------------------------------------------------------------------------

TEST(ActivationCheckpoint, SequentialGradientsEqualPlainToTheBitWithDropout) {
  for (int64_t every : {1, 2, 4, 5}) {
    torch::manual_seed(0);
    auto plain = test::residual_mlp_blocks(5, 8, 0.3);
    auto ckpt = copy_blocks(plain, 5, 8, 0.3);
    auto x = torch::randn({4, 8});
    auto x_plain = x.clone().requires_grad_(true), x_ckpt = x.clone().requires_grad_(true);

    torch::manual_seed(3);
    auto want = plain->forward(x_plain).pow(2).sum();
    want.backward();
    auto want_next = torch::rand({2});
    torch::manual_seed(3);
    auto got = checkpoint_sequential(ckpt, x_ckpt, every).pow(2).sum();
    got.backward();
    auto got_next = torch::rand({2});

    const std::string where = "every " + std::to_string(every);
    EXPECT_TRUE(test::tensors_equal(got, want)) << where;
    EXPECT_TRUE(test::tensors_equal(x_ckpt.grad(), x_plain.grad())) << where << ": input gradient";
    expect_same_grads(*ckpt, *plain, where);
    EXPECT_TRUE(test::tensors_equal(got_next, want_next)) << where << ": backward must not advance the generator";
  }
}

TEST(ActivationCheckpoint, WithoutRestoringTheGeneratorDropoutGradientsAreWrong) {
  torch::manual_seed(0);
  auto plain = test::residual_mlp_blocks(2, 8, 0.5);
  auto ckpt = copy_blocks(plain, 2, 8, 0.5);
  auto x = torch::randn({16, 8});
  torch::manual_seed(3);
  plain->forward(x).sum().backward();
  torch::manual_seed(3);
  CheckpointOptions no_rng;
  no_rng.preserve_rng_state = false;
  checkpoint_sequential(ckpt, x, 1, no_rng).sum().backward();
  // The first block was recomputed with fresh dropout masks.
  auto got = ckpt->parameters()[0].grad(), want = plain->parameters()[0].grad();
  EXPECT_FALSE(torch::equal(got, want)) << "preserve_rng_state = false should have drawn new masks";
}

TEST(ActivationCheckpoint, ManyInputsAndOutputsUnusedOutputAndParametersByModule) {
  torch::manual_seed(0);
  torch::nn::Linear a(6, 6), b(6, 6);
  auto x = torch::randn({3, 6}, torch::requires_grad()), y = torch::randn({3, 6}, torch::requires_grad());
  auto segment = [&](const std::vector<torch::Tensor>& in) {
    auto h = torch::tanh(a(in[0]) * in[1]);
    return std::vector<torch::Tensor>{b(h), h.sum(1)};  // the second output goes unused below
  };
  auto plain = segment({x, y});
  plain[0].pow(2).sum().backward();
  std::vector<torch::Tensor> want{x.grad().clone(), y.grad().clone()};
  std::vector<torch::Tensor> want_params;
  for (auto& p : a->parameters()) want_params.push_back(p.grad().clone());
  for (auto& p : b->parameters()) want_params.push_back(p.grad().clone());
  x.mutable_grad() = y.mutable_grad() = torch::Tensor();
  a->zero_grad();
  b->zero_grad();

  std::vector<torch::Tensor> params = a->parameters();
  for (auto& p : b->parameters()) params.push_back(p);
  auto out = checkpoint_tensors(segment, {x, y}, params);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(test::tensors_equal(out[0], plain[0].detach()));
  out[0].pow(2).sum().backward();
  EXPECT_TRUE(test::tensors_equal(x.grad(), want[0]));
  EXPECT_TRUE(test::tensors_equal(y.grad(), want[1]));
  size_t i = 0;
  for (auto& p : a->parameters()) EXPECT_TRUE(test::tensors_equal(p.grad(), want_params[i++]));
  for (auto& p : b->parameters()) EXPECT_TRUE(test::tensors_equal(p.grad(), want_params[i++]));

  // A module: its parameters are routed for it.
  b->zero_grad();
  auto z = checkpoint_module(b, x.detach());
  z.sum().backward();
  EXPECT_TRUE(b->weight.grad().defined());
}

// Parameter gradients reach .grad through the engine's AccumulateGrad: they add up across
// backward passes, autograd::grad from outside returns them without touching .grad, and
// post-accumulate-grad hooks (DDP's) fire.
TEST(ActivationCheckpoint, ParameterGradientsGoThroughAccumulateGrad) {
  torch::manual_seed(0);
  auto blocks = test::residual_mlp_blocks(3, 8, 0.0);
  auto x = torch::randn({4, 8});
  checkpoint_sequential(blocks, x, 1).sum().backward();
  auto once = blocks->parameters()[0].grad().clone();
  checkpoint_sequential(blocks, x, 1).sum().backward();
  EXPECT_TRUE(test::tensors_close(blocks->parameters()[0].grad(), 2 * once, 1e-6, 1e-7)) << "gradients accumulate";

  blocks->zero_grad(/*set_to_none=*/true);
  auto first = blocks->parameters()[0];
  auto grads = torch::autograd::grad({checkpoint_sequential(blocks, x, 1).sum()}, {first});
  EXPECT_TRUE(test::tensors_equal(grads[0], once));
  EXPECT_FALSE(first.grad().defined()) << "autograd::grad must not write .grad";

  struct Count : torch::autograd::PostAccumulateGradHook {
    int* calls;
    explicit Count(int* c) : calls(c) {}
    void operator()(const torch::autograd::Variable&) override { ++*calls; }
  };
  int calls = 0;
  torch::autograd::impl::set_post_acc_grad_hooks(first, std::make_unique<Count>(&calls));
  checkpoint_sequential(blocks, x, 1).sum().backward();
  EXPECT_EQ(calls, 1) << "the post-accumulate-grad hook of a checkpointed parameter";
}

// The recomputation runs under the forward's autocast state, even though backward runs outside it.
TEST(ActivationCheckpoint, ReplaysAutocastOfTheForward) {
  torch::manual_seed(0);
  auto plain = test::residual_mlp_blocks(2, 8, 0.0);
  auto ckpt = copy_blocks(plain, 2, 8, 0.0);
  auto x = torch::randn({4, 8});
  torch::Tensor want, got;
  {
    AutocastGuard autocast(c10::kCPU, c10::kBFloat16);
    want = plain->forward(x).to(torch::kFloat).pow(2).sum();
    got = checkpoint_sequential(ckpt, x, 1).to(torch::kFloat).pow(2).sum();
  }
  want.backward();
  got.backward();  // outside autocast: the recomputation must still run in bf16
  EXPECT_TRUE(test::tensors_equal(got, want));
  expect_same_grads(*ckpt, *plain, "bf16 autocast");
}

TEST(ActivationCheckpoint, NoGradRunsTheSegmentAndInPlaceChangesAreCaught) {
  auto blocks = test::residual_mlp_blocks(2, 8, 0.0);
  auto x = torch::randn({4, 8});
  {
    torch::NoGradGuard no_grad;
    auto y = checkpoint_sequential(blocks, x, 1);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_TRUE(test::tensors_equal(y, blocks->forward(x)));
  }
  auto input = torch::randn({4, 8}, torch::requires_grad());
  auto h = input * 2;  // a non-leaf input of the checkpointed segment
  auto y = checkpoint([&](const torch::Tensor& t) { return blocks->forward(t); }, h, blocks->parameters());
  {
    torch::NoGradGuard no_grad;
    h.add_(1);  // modifies what the checkpoint saved
  }
  EXPECT_TRUE(test::throws_with([&] { y.sum().backward(); }, {"modified by an inplace operation"}));
}

// Exact bytes: with every block checkpointed, a depth-8 stack of MLP blocks keeps one (N, width)
// input per block instead of about ten tensors of that size.
TEST(ActivationCheckpoint, PeakBytesFallOnTheCpu) {
  torch::manual_seed(0);
  auto blocks = test::residual_mlp_blocks(8, 64, 0.0);
  auto x = torch::randn({512, 64});
  auto peak = [&](int64_t every) {
    blocks->zero_grad(/*set_to_none=*/true);
    test::CpuAllocationCounter counter;
    checkpoint_sequential(blocks, x, every).pow(2).sum().backward();
    return counter.peak();
  };
  const int64_t plain = peak(0), every_block = peak(1), every_other = peak(2);
  EXPECT_LT(static_cast<double>(every_block), 0.4 * static_cast<double>(plain))
      << every_block << " bytes checkpointed vs " << plain << " plain";
  EXPECT_LT(every_other, plain);
}

// ---- the batch-size finder ------------------------------------------------------------------------

struct FinderModel {
  torch::nn::Sequential model{torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8), torch::nn::Linear(8, 2)};
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  explicit FinderModel(bool adam = false) {
    torch::manual_seed(0);
    if (adam)
      optimizer = std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(1e-2));
    else
      optimizer = std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  }
  void step(int64_t batch) {
    optimizer->zero_grad();
    batch = std::max<int64_t>(batch, 2);  // BatchNorm needs two samples to train
    model->forward(torch::randn({batch, 4})).pow(2).mean().backward();
    optimizer->step();
  }
};

BatchFinderConfig config(int64_t start, int64_t multiple, int64_t max_batch = 1 << 14) {
  BatchFinderConfig c;
  c.start = start;
  c.multiple_of = multiple;
  c.max_batch = max_batch;
  c.trial_steps = 2;
  c.safety_margin = 0.1;
  return c;
}

TEST(BatchFinder, FakeLimitsGiveExactAnswers) {
  struct Case {
    int64_t limit, start, multiple, max_batch, largest, oom, recommended;
  };
  for (const Case& c : {Case{1000, 8, 8, 1 << 14, 1000, 1008, 896},    // 900 -> 896
                        Case{1000, 1, 1, 1 << 14, 1000, 1001, 900},
                        Case{5, 64, 1, 1 << 14, 5, 6, 4},               // start too big: bisect down
                        Case{3, 8, 8, 1 << 14, 0, 8, 0},                // nothing fits
                        Case{1 << 20, 8, 8, 3000, 3000, 0, 2696},       // all fit up to max_batch (2700 -> 2696)
                        Case{100, 10, 4, 1 << 14, 100, 104, 88}}) {     // start rounded up to 12
    FinderModel s;
    auto search = find_batch_size([&](int64_t b) { s.step(b); }, *s.model, s.optimizer.get(), torch::kCPU,
                                  config(c.start, c.multiple, c.max_batch), [&](int64_t b) { return b <= c.limit; });
    const std::string where = "limit " + std::to_string(c.limit) + ", start " + std::to_string(c.start);
    EXPECT_EQ(search.largest_fit, c.largest) << where;
    EXPECT_EQ(search.smallest_oom, c.oom) << where;
    EXPECT_EQ(search.recommended, c.recommended) << where;
    for (const auto& t : search.trials) EXPECT_EQ(t.batch % c.multiple, 0) << where;
    EXPECT_LT(search.trials.size(), 40u) << where;
    if (c.largest > 0) {
      EXPECT_GT(search.best_throughput, 0) << where;
      EXPECT_LE(search.best_throughput, c.largest) << where;
    }
  }
}

TEST(BatchFinder, CatchesOutOfMemoryFromTheStepAndRestoresAdamState) {
  FinderModel s(/*adam=*/true);
  s.step(16);
  std::vector<torch::Tensor> params, exp_avg;
  std::vector<int64_t> steps;
  for (auto& p : s.model->parameters()) {
    params.push_back(p.detach().clone());
    auto& st = static_cast<torch::optim::AdamParamState&>(*s.optimizer->state().at(p.unsafeGetTensorImpl()));
    exp_avg.push_back(st.exp_avg().clone());
    steps.push_back(st.step());
  }
  auto running_mean = s.model->buffers()[0].clone();
  s.optimizer->zero_grad();  // gradients undefined before the search: undefined after
  auto step = [&](int64_t b) {
    s.step(b);
    if (b > 40) TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate 1 GiB.\nmore advice");
  };
  auto search = find_batch_size(step, *s.model, s.optimizer.get(), torch::kCPU, config(8, 4));
  EXPECT_EQ(search.largest_fit, 40);
  EXPECT_EQ(search.smallest_oom, 44);
  for (const auto& t : search.trials)
    if (!t.fits) {
      EXPECT_EQ(t.error.find('\n'), std::string::npos) << "one line: " << t.error;
    }
  auto now = s.model->parameters();
  for (size_t i = 0; i < now.size(); ++i) {
    EXPECT_TRUE(test::tensors_equal(now[i], params[i])) << i;
    EXPECT_FALSE(now[i].grad().defined()) << i;
    auto& st = static_cast<torch::optim::AdamParamState&>(*s.optimizer->state().at(now[i].unsafeGetTensorImpl()));
    EXPECT_TRUE(test::tensors_equal(st.exp_avg(), exp_avg[i])) << i;
    EXPECT_EQ(st.step(), steps[i]) << i;
  }
  EXPECT_TRUE(test::tensors_equal(s.model->buffers()[0], running_mean));
}

TEST(BatchFinder, StateCreatedByTrialsIsDroppedAndOtherErrorsPropagateAfterRestoring) {
  FinderModel s;  // SGD with momentum, no step yet: no optimizer state at all
  auto before = s.model->parameters()[0].detach().clone();
  find_batch_size([&](int64_t b) { s.step(b); }, *s.model, s.optimizer.get(), torch::kCPU, config(8, 8),
                  [](int64_t b) { return b <= 64; });
  EXPECT_TRUE(s.optimizer->state().empty()) << "momentum buffers created by the trials must go";
  EXPECT_TRUE(test::tensors_equal(s.model->parameters()[0], before));

  auto boom = [&](int64_t b) {
    s.step(b);
    if (b > 16) throw std::runtime_error("data loader crashed");
  };
  EXPECT_TRUE(test::throws_with([&] { find_batch_size(boom, *s.model, s.optimizer.get(), torch::kCPU, config(8, 8)); },
                                {"data loader crashed"}));
  EXPECT_TRUE(test::tensors_equal(s.model->parameters()[0], before)) << "restored before rethrowing";
}

// Optimizers whose state the snapshot does not know (RMSprop) go through their own save/load.
TEST(TrainingSnapshot, OtherOptimizersRoundTripThroughTheirSerialization) {
  torch::manual_seed(0);
  torch::nn::Linear net(4, 3);
  torch::optim::RMSprop rmsprop(net->parameters(), torch::optim::RMSpropOptions(0.01).momentum(0.5));
  auto step = [&] {
    rmsprop.zero_grad();
    net->forward(torch::randn({8, 4})).pow(2).mean().backward();
    rmsprop.step();
  };
  step();
  auto weight = net->weight.detach().clone();
  auto& state = static_cast<torch::optim::RMSpropParamState&>(*rmsprop.state().at(net->weight.unsafeGetTensorImpl()));
  auto square_avg = state.square_avg().clone();
  TrainingSnapshot snapshot(*net, &rmsprop);
  step();
  step();
  static_cast<torch::optim::RMSpropOptions&>(rmsprop.param_groups()[0].options()).lr(1.0);
  snapshot.restore();
  EXPECT_TRUE(test::tensors_equal(net->weight, weight));
  auto& restored = static_cast<torch::optim::RMSpropParamState&>(*rmsprop.state().at(net->weight.unsafeGetTensorImpl()));
  EXPECT_TRUE(test::tensors_equal(restored.square_avg(), square_avg));
  EXPECT_EQ(restored.step(), 1);
  EXPECT_EQ(static_cast<torch::optim::RMSpropOptions&>(rmsprop.param_groups()[0].options()).lr(), 0.01);
}

TEST(BatchFinder, BestThroughputIsTheFastestBatchThatFit) {
  auto trial = [](int64_t batch, bool fits, double ms, double sps) {
    BatchTrial t;
    t.batch = batch;
    t.fits = t.ran = true;
    t.fits = fits;
    t.step_ms = ms;
    t.samples_per_second = sps;
    return t;
  };
  std::vector<BatchTrial> trials{trial(8, true, 1.0, 8000.0), trial(16, true, 1.5, 10666.0), trial(32, false, 0.0, 0.0),
                                 trial(24, true, 2.5, 9600.0)};
  auto [batch, sps] = best_throughput(trials);
  EXPECT_EQ(batch, 16);
  EXPECT_EQ(sps, 10666.0);
  EXPECT_EQ(best_throughput({}).first, 0);
}

// ---- out-of-memory helpers ----------------------------------------------------------------------

TEST(MemoryHelpers, RecognisesOutOfMemoryErrors) {
  try {
    TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79 GiB\nIf reserved...");
  } catch (const std::exception& e) {
    EXPECT_TRUE(is_out_of_memory(e));
    EXPECT_EQ(oom_summary(e), "CUDA out of memory. Tried to allocate 2.00 GiB");
  }
  try {
    TORCH_CHECK(false, "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)");
  } catch (const std::exception& e) {
    EXPECT_TRUE(is_out_of_memory(e)) << "cuBLAS workspace allocation";
  }
  EXPECT_FALSE(is_out_of_memory(std::runtime_error("index out of range")));
  EXPECT_TRUE(test::throws_with([] { limit_device_memory(torch::kCPU, 1 << 30); }, {"needs a GPU"}));
  EXPECT_EQ(device_total_memory(torch::kCPU), 0);
  free_cached_memory(torch::kCPU);  // a no-op
}

TEST(MemoryHelpers, TrackerSamplesInsideAPhase) {
  MemoryConfig c;
  MemoryTracker tracker(torch::kCPU, c);
  tracker.sample();  // no phase open: ignored
  tracker.begin(Phase::forward);
  tracker.sample();
  tracker.sample();
  tracker.begin(Phase::backward);
  tracker.end_step(0);
  const auto& t = tracker.timeline();
  ASSERT_EQ(t.size(), 4u);
  EXPECT_FALSE(t[0].phase_end);
  EXPECT_EQ(t[0].phase, Phase::forward);
  EXPECT_TRUE(t[2].phase_end);
  EXPECT_EQ(t[3].phase, Phase::backward);
  test::TempDir dir;
  tracker.write_timeline_csv(dir.file("t.csv"));
  std::ifstream in(dir.file("t.csv"));
  std::string header, first;
  std::getline(in, header);
  std::getline(in, first);
  EXPECT_NE(header.find(",event"), std::string::npos);
  EXPECT_NE(first.find(",sample"), std::string::npos);
}

}  // namespace
}  // namespace amplab
