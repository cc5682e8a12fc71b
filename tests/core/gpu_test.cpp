// Core behaviour on a GPU: autocast dtypes, loss scaling with fp16, the memory tracker against
// analytic sizes, CUDA-graph steps equal to eager ones. Every test skips without a GPU (CI) and
// runs on the GPU machine (label gpu).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>

#include <ATen/ops/_fused_adamw.h>

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>

#include "amplab/fast/cuda/fp8_cast_kernels.hpp"
#include "amplab/fast/cuda/fused_adamw_launch.hpp"
#include "amplab/fast/cuda/mnist_features_kernels.hpp"
#include "amplab/fast/cuda/mnist_head_kernels.hpp"
#include "amplab/fast/cuda/residual_norm_kernels.hpp"
#include "amplab/fast/fused_layers.hpp"
#include "amplab/models/models.hpp"
#include "amplab/fast/cuda_graph.hpp"
#include "amplab/fast/fast_path.hpp"
#include "amplab/fast/fused_fp8_mlp.hpp"
#include "amplab/fast/fused_mnist_net.hpp"
#include "amplab/fast/fused_residual_norm.hpp"
#include "amplab/infra/device.hpp"
#include "amplab/measure/gpu_monitor.hpp"
#include "amplab/measure/memory.hpp"
#include "amplab/train/precision.hpp"
#include "amplab/measure/timing.hpp"
#include "amplab/train/trainer.hpp"
#include "support.hpp"

namespace amplab {
namespace {

const torch::Device kGpu(torch::kCUDA, 0);

TEST(GpuPrecision, AutocastDtypesOnCuda_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  auto a = torch::randn({64, 64}, kGpu);
  for (auto [precision, dtype] : {std::pair{Precision::fp16_mixed, torch::kHalf}, std::pair{Precision::bf16_mixed, torch::kBFloat16}}) {
    AutocastGuard guard(kGpu, precision);
    EXPECT_EQ(torch::mm(a, a).scalar_type(), dtype);
    EXPECT_EQ(torch::log_softmax(torch::mm(a, a), 1).scalar_type(), torch::kFloat);  // fp32 op under autocast
  }
  EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kFloat);
}

struct Mlp : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  Mlp(int64_t width = 256) {
    fc1 = register_module("fc1", torch::nn::Linear(width, width));
    fc2 = register_module("fc2", torch::nn::Linear(width, 10));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }
};

TEST(GpuTrainer, Fp16SkipsAnOverflowingStepAndBacksOff_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  torch::manual_seed(0);
  auto net = std::make_shared<Mlp>();
  net->to(kGpu);
  bool poison = false;
  torch::ScalarType seen = torch::kFloat;
  TrainConfig config;
  config.precision = Precision::fp16_mixed;
  config.optimizer.lr = 0.01;
  Trainer trainer(net, [&](const Batch& b) {
    auto out = net->forward(b.input);
    seen = out.scalar_type();
    auto loss = torch::nn::functional::cross_entropy(out, b.target);
    return poison ? loss * std::numeric_limits<float>::infinity() : loss;
  }, config, kGpu);
  Batch batch{torch::randn({32, 256}, kGpu), torch::randint(0, 10, {32}, torch::dtype(torch::kInt64).device(kGpu))};
  auto r = trainer.step(batch);
  EXPECT_EQ(seen, torch::kHalf);
  EXPECT_EQ(r.skipped.item<double>(), 0.0);
  poison = true;
  auto before = net->fc1->weight.clone();
  r = trainer.step(batch);
  EXPECT_EQ(r.skipped.item<double>(), 1.0);
  EXPECT_TRUE(test::tensors_equal(net->fc1->weight, before));
  EXPECT_EQ(trainer.scaler().get_scale(), 32768.0);
}

TEST(GpuMemory, AllocatingATensorMovesAllocatedByItsSize_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  torch::cuda::synchronize();
  auto before = read_memory(kGpu).allocated;
  auto t = torch::empty({64 << 20}, torch::dtype(torch::kFloat32).device(kGpu));  // 256 MiB
  auto after = read_memory(kGpu).allocated;
  EXPECT_EQ(after - before, 256LL << 20);
  t.reset();
  EXPECT_EQ(read_memory(kGpu).allocated, before);
}

// Phase peaks of a known MLP against the analytic count. Weights W, gradients G = W, SGD with
// momentum keeps buffers M = W; activations A of the batch. Forward peak ~ W + A; backward peak
// ~ W + G + A (+ temporaries); optimizer ~ W + G + M.
TEST(GpuMemory, PhasePeaksOfAKnownMlpMatchTheAnalyticCount_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  const int64_t width = 4096, batch = 1024, layers = 4;
  torch::manual_seed(0);
  auto net = std::make_shared<torch::nn::SequentialImpl>();
  for (int i = 0; i < layers; ++i) {
    net->push_back(torch::nn::Linear(torch::nn::LinearOptions(width, width).bias(false)));
    net->push_back(torch::nn::ReLU());
  }
  net->to(kGpu);
  TrainConfig config;
  config.optimizer.momentum = 0.9;
  Trainer trainer(net, [&](const Batch& b) { return net->forward(b.input).pow(2).mean(); }, config, kGpu);
  Batch data{torch::randn({batch, width}, kGpu), torch::zeros({batch}, kGpu)};
  for (int i = 0; i < 3; ++i) trainer.step(data);
  const double mib = 1 << 20;
  const double weights = layers * width * width * 4 / mib;  // 256 MiB
  const double activation = batch * width * 4 / mib;        // 16 MiB per tensor
  const double input = activation;
  double forward = trainer.memory().phase_peak(Phase::forward) / mib;
  double backward = trainer.memory().phase_peak(Phase::backward) / mib;
  double optimizer = trainer.memory().phase_peak(Phase::optimizer) / mib;
  std::cout << "[ memory   ] weights " << weights << " MiB, one activation " << activation << " MiB; peaks: forward "
            << forward << ", backward " << backward << ", optimizer " << optimizer << " MiB\n";
  // Forward: weights + momentum (kept from the last step) + input + 2 saved tensors per layer.
  double forward_expected = 2 * weights + input + 2 * layers * activation;
  EXPECT_NEAR(forward, forward_expected, 0.15 * forward_expected);
  // Backward adds the gradients (= weights).
  EXPECT_GT(backward, 2 * weights + weights * 0.9);
  EXPECT_LT(backward, 3 * weights + input + (2 * layers + 4) * activation);
  // Optimizer: weights + gradients + momentum.
  EXPECT_NEAR(optimizer, 3 * weights + input, 0.1 * 3 * weights);
}

// Two copies of one randomly initialised Mlp on the GPU, for eager-versus-graph comparisons, the
// loss they train with, and the config the graph needs (the fast path's fused SGD).
std::pair<std::shared_ptr<Mlp>, std::shared_ptr<Mlp>> twin_mlps_on_gpu(uint64_t seed) {
  torch::manual_seed(seed);
  auto a = std::make_shared<Mlp>(), b = std::make_shared<Mlp>();
  {
    torch::NoGradGuard g;
    for (size_t i = 0; i < a->parameters().size(); ++i) b->parameters()[i].copy_(a->parameters()[i]);
  }
  a->to(kGpu);
  b->to(kGpu);
  return {a, b};
}

LossFn cross_entropy_of(std::shared_ptr<Mlp> net) {
  return [net](const Batch& b) { return torch::nn::functional::cross_entropy(net->forward(b.input), b.target); };
}

TrainConfig graph_config(Precision precision) {
  TrainConfig config;
  config.precision = precision;
  config.optimizer.lr = 0.05;
  config.optimizer.momentum = 0.9;
  config.fast_path = true;
  return config;
}

// Replaying the captured step gives what eager steps give (dropout-free model, same data).
TEST(GpuCudaGraph, GraphedStepsEqualEagerSteps_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  for (Precision precision : {Precision::fp32, Precision::bf16_mixed, Precision::fp16_mixed}) {
    SCOPED_TRACE(to_string(precision));
    auto [eager_net, graph_net] = twin_mlps_on_gpu(1);
    TrainConfig config = graph_config(precision);
    Trainer eager(eager_net, cross_entropy_of(eager_net), config, kGpu, {}, make_fast_path_optimizer);
    Trainer graphed(graph_net, cross_entropy_of(graph_net), config, kGpu, {}, make_fast_path_optimizer);
    GraphedTrainStep graph(graphed);
    for (int step = 0; step < 8; ++step) {
      Batch b{torch::randn({64, 256}, kGpu), torch::randint(0, 10, {64}, torch::dtype(torch::kInt64).device(kGpu))};
      auto e = eager.step(b);
      auto g = graph.step(b);
      EXPECT_TRUE(test::tensors_close(g.loss, e.loss, 1e-5, 1e-6)) << "step " << step;
    }
    EXPECT_TRUE(graph.captured());
    for (size_t i = 0; i < eager_net->parameters().size(); ++i)
      EXPECT_TRUE(test::tensors_close(graph_net->parameters()[i], eager_net->parameters()[i], 1e-4, 1e-5));
    EXPECT_EQ(graphed.global_step(), 8);
  }
}

// A schedule under a graph: set_learning_rate before each replay reaches the captured fused kernel
// (through its device copy of the rate), so the graph follows the same rates as eager steps. For
// fused AdamW the graph also advances the step counts (bias correction), and with fp16 it takes a
// skipped step back on the device.
TEST(GpuCudaGraph, GraphedStepsFollowTheLearningRateSchedule_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  for (auto [name, precision] : {std::pair{"sgd", Precision::bf16_mixed}, {"adamw", Precision::bf16_mixed},
                                 {"adamw", Precision::fp16_mixed}}) {
    SCOPED_TRACE(std::string(name) + " " + to_string(precision));
    auto [eager_net, graph_net] = twin_mlps_on_gpu(2);
    TrainConfig config = graph_config(precision);
    config.optimizer.name = name;
    if (config.optimizer.name == "adamw") config.optimizer.lr = 0.01;
    config.optimizer.schedule = "linear";
    config.optimizer.warmup = 0.25;
    Trainer eager(eager_net, cross_entropy_of(eager_net), config, kGpu, {}, make_fast_path_optimizer);
    Trainer graphed(graph_net, cross_entropy_of(graph_net), config, kGpu, {}, make_fast_path_optimizer);
    GraphedTrainStep graph(graphed);
    torch::Tensor initial = graph_net->parameters()[0].detach().clone();
    const int steps = 8;
    for (int step = 0; step < steps; ++step) {
      Batch b{torch::randn({64, 256}, kGpu), torch::randint(0, 10, {64}, torch::dtype(torch::kInt64).device(kGpu))};
      const bool overflow = precision == Precision::fp16_mixed && step == 3;
      if (overflow) b.input.fill_(1e6);  // overflows fp16: a skipped step
      double lr = scheduled_lr(config.optimizer, step, steps);
      set_learning_rate(eager.optimizer(), lr);
      set_learning_rate(graphed.optimizer(), lr);
      auto e = eager.step(b);
      auto g = graph.step(b);
      if (!overflow) {
        EXPECT_TRUE(test::tensors_close(g.loss, e.loss, 1e-5, 1e-6)) << "step " << step;
      }
    }
    EXPECT_TRUE(graph.captured());
    if (precision == Precision::fp16_mixed) {
      EXPECT_EQ(graphed.scaler().get_scale(), 32768.0);  // it did skip once
    }
    EXPECT_FALSE(test::tensors_equal(graph_net->parameters()[0], initial));                    // and it did step
    EXPECT_EQ(graphed.scaler().get_scale(), eager.scaler().get_scale());
    for (size_t i = 0; i < eager_net->parameters().size(); ++i)
      EXPECT_TRUE(test::tensors_close(graph_net->parameters()[i], eager_net->parameters()[i], 1e-4, 1e-5)) << "parameter " << i;
  }
}

// What a graph cannot replay is refused up front with the key to change, not trained wrongly.
TEST(GpuCudaGraph, RefusesOptimizersThatDecideOnTheHost_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  auto [net, unused] = twin_mlps_on_gpu(3);
  TrainConfig adamw = graph_config(Precision::bf16_mixed);
  adamw.optimizer.name = "adamw";
  adamw.fast_path = false;
  Trainer plain_adamw(net, cross_entropy_of(net), adamw, kGpu);
  EXPECT_TRUE(test::throws_with([&] { GraphedTrainStep g(plain_adamw); }, {"train.fast_path", "a fused optimizer"}));
  TrainConfig scheduled = graph_config(Precision::bf16_mixed);
  scheduled.fast_path = false;
  scheduled.optimizer.schedule = "linear";
  Trainer plain_sgd(net, cross_entropy_of(net), scheduled, kGpu);
  EXPECT_TRUE(test::throws_with([&] { GraphedTrainStep g(plain_sgd); }, {"train.fast_path", "schedule", "a fused optimizer"}));
}

// A step that waits for the GPU on the host (an .item() in the loss) runs eagerly but cannot be
// captured: the capture fails in one line naming train.fast_path and what to do, the failed
// capture is ended, and the device goes on working.
TEST(GpuCudaGraph, AStepThatSyncsOnTheHostFailsToCaptureInOneLine_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  auto [net, twin] = twin_mlps_on_gpu(4);
  LossFn syncing = [inner = cross_entropy_of(net)](const Batch& b) {
    torch::Tensor loss = inner(b);
    EXPECT_TRUE(std::isfinite(loss.item<double>()));  // the host waits for the GPU here
    return loss;
  };
  Trainer trainer(net, syncing, graph_config(Precision::fp32), kGpu, {}, make_fast_path_optimizer);
  GraphedTrainStep graph(trainer, /*warmup_steps=*/2);
  Batch b{torch::randn({64, 256}, kGpu), torch::randint(0, 10, {64}, torch::dtype(torch::kInt64).device(kGpu))};
  for (int i = 0; i < 2; ++i) graph.step(b);  // eager warm-up steps: fine
  EXPECT_TRUE(test::throws_with([&] { graph.step(b); },
                                {"train.fast_path", "cannot be captured", "on the host", "train.fast_path=false"}));
  EXPECT_FALSE(graph.captured());
  EXPECT_EQ(torch::ones({8}, kGpu).sum().item<float>(), 8.0f) << "the device after the failed capture";
  EXPECT_TRUE(torch::isfinite(torch::randn({8}, kGpu)).all().item<bool>()) << "its random generator after it";
  Trainer eager(twin, cross_entropy_of(twin), graph_config(Precision::fp32), kGpu, {}, make_fast_path_optimizer);
  EXPECT_TRUE(std::isfinite(eager.step(b).loss.item<double>())) << "an eager step after the failed capture";
}

// train.fast_path on a GPU: fit() gets a step replayed as one CUDA graph in one process, eager
// steps across processes, and a refusal naming both keys with accumulation.
TEST(GpuCudaGraph, FastPathStepsReplayAGraphInOneProcess_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  auto [net, unused] = twin_mlps_on_gpu(4);
  TrainConfig config = graph_config(Precision::bf16_mixed);
  Trainer trainer(net, cross_entropy_of(net), config, kGpu, {}, make_fast_path_optimizer);
  FastPathSteps steps = fast_path_steps(trainer);
  ASSERT_TRUE(steps.run_step);
  EXPECT_EQ(steps.description, "fast path on (train.fast_path): fused sgd, one CUDA graph per step");
  TensorBatches batches(torch::randn({256, 256}, kGpu), torch::randint(0, 10, {256}, torch::dtype(torch::kInt64).device(kGpu)),
                        EpochSampler(256, 64, 0, false, true), kGpu);
  for (int64_t i = 0; i < 4; ++i) EXPECT_TRUE(steps.run_step(batches, i, 1).loss.isfinite().item<bool>());
  EXPECT_EQ(trainer.global_step(), 4);
  EXPECT_FALSE(fast_path_steps(trainer, /*processes=*/2).run_step);
  config.accumulation_steps = 2;
  Trainer accumulating(net, cross_entropy_of(net), config, kGpu, {}, make_fast_path_optimizer);
  EXPECT_TRUE(test::throws_with([&] { fast_path_steps(accumulating); },
                                {"train.fast_path", "train.accumulation_steps=1", "train.fast_path=false"}));
}

// ---- Fused AdamW with chunks sized to the model ---------------------------------------------------

// One AdamW state: parameters, gradients, moments (and AMSGrad's maximum), step counts.
struct AdamWTensors {
  std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
  AdamWTensors clone() const {
    auto copy = [](const std::vector<torch::Tensor>& v) {
      std::vector<torch::Tensor> out;
      for (const auto& t : v) out.push_back(t.clone());
      return out;
    };
    return {copy(params), copy(grads), copy(exp_avgs), copy(exp_avg_sqs), copy(max_exp_avg_sqs), copy(steps)};
  }
};

AdamWTensors random_adamw_state(const std::vector<int64_t>& numels, torch::ScalarType dtype, bool amsgrad) {
  AdamWTensors s;
  auto on_gpu = torch::dtype(dtype).device(kGpu);
  for (int64_t n : numels) {
    s.params.push_back(torch::randn({n}, on_gpu));
    s.grads.push_back(torch::randn({n}, on_gpu) * 1024);
    s.exp_avgs.push_back(torch::randn({n}, on_gpu) * 0.1);
    s.exp_avg_sqs.push_back(torch::rand({n}, on_gpu) * 0.01);
    if (amsgrad) s.max_exp_avg_sqs.push_back(s.exp_avg_sqs.back() + torch::rand({n}, on_gpu) * 0.01);
    s.steps.push_back(torch::full({}, 3.0f, torch::dtype(torch::kFloat32).device(kGpu)));
  }
  return s;
}

void expect_lists_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(test::tensors_equal(a[i], b[i])) << what << " " << i;
}

// Our launcher runs PyTorch's AdamW functor over smaller chunks: every parameter, moment and
// (unscaled) gradient must equal at::_fused_adamw_'s to the bit, with a device rate, an fp16
// grad scale, a skipped step, AMSGrad, reduced-precision parameters, more tensors than one
// launch holds and a tensor split across launches.
TEST(GpuFusedAdamW, ChunkedLaunchEqualsPyTorchsKernelToTheBit_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  torch::manual_seed(0);
  const std::vector<int64_t> mnist_like = {288, 32, 18432, 64, 1179648, 128, 1280, 10, 7, 65537};
  std::vector<int64_t> many(50, 3001);
  many.push_back(25'000'003);  // > 320 chunks of 65536: split across launches
  struct Case {
    const char* name;
    std::vector<int64_t> numels;
    torch::ScalarType dtype;
    bool amsgrad, scaled;
  };
  for (const Case& c : {Case{"mnist-sized", mnist_like, torch::kFloat, false, false},
                        Case{"grad scale", mnist_like, torch::kFloat, false, true},
                        Case{"amsgrad", mnist_like, torch::kFloat, true, true},
                        Case{"bf16", mnist_like, torch::kBFloat16, false, false},
                        Case{"many and large", many, torch::kFloat, false, true}}) {
    SCOPED_TRACE(c.name);
    AdamWTensors ours = random_adamw_state(c.numels, c.dtype, c.amsgrad);
    AdamWTensors theirs = ours.clone();
    torch::Tensor initial_last = ours.params.back().clone();
    ASSERT_TRUE(cuda::can_run_fused_adamw_chunked(ours.params, ours.grads, ours.exp_avgs, ours.exp_avg_sqs,
                                                  ours.max_exp_avg_sqs));
    auto lr = torch::full({}, 0.006f, torch::dtype(torch::kFloat32).device(kGpu));
    cuda::AdamWHyper hyper{0.0, 0.9, 0.99, 0.01, 1e-8, c.amsgrad};
    for (int step = 0; step < 3; ++step) {
      std::optional<torch::Tensor> scale, found_inf;
      if (c.scaled) {
        scale = torch::full({}, 1024.0f, torch::dtype(torch::kFloat32).device(kGpu));
        found_inf = torch::full({}, step == 1 ? 1.0f : 0.0f, torch::dtype(torch::kFloat32).device(kGpu));
      }
      cuda::fused_adamw_chunked(ours.params, ours.grads, ours.exp_avgs, ours.exp_avg_sqs, ours.max_exp_avg_sqs,
                                ours.steps, lr, hyper, scale, found_inf);
      at::_fused_adamw_(theirs.params, theirs.grads, theirs.exp_avgs, theirs.exp_avg_sqs, theirs.max_exp_avg_sqs,
                        theirs.steps, lr, hyper.beta1, hyper.beta2, hyper.weight_decay, hyper.eps, c.amsgrad,
                        /*maximize=*/false, scale, found_inf);
      for (auto* s : {&ours, &theirs})
        for (auto& t : s->steps) t.add_(1);
    }
    EXPECT_FALSE(test::tensors_equal(ours.params.back(), initial_last));  // it did update
    expect_lists_equal(ours.params, theirs.params, "param");
    expect_lists_equal(ours.grads, theirs.grads, "grad");
    expect_lists_equal(ours.exp_avgs, theirs.exp_avgs, "exp_avg");
    expect_lists_equal(ours.exp_avg_sqs, theirs.exp_avg_sqs, "exp_avg_sq");
    expect_lists_equal(ours.max_exp_avg_sqs, theirs.max_exp_avg_sqs, "max_exp_avg_sq");
  }
}

// ---- The MNIST layers' fused kernels ----------------------------------------------------------------

// max_pool2d(relu(x + b), 2) both ways from the same leaves: our kernel (fused) and PyTorch's ops.
struct PoolResult {
  torch::Tensor y, grad_x, grad_bias;
};

PoolResult run_bias_relu_max_pool2(bool fused, const torch::Tensor& x0, const torch::Tensor& bias0, const torch::Tensor& grad_y) {
  auto x = x0.detach().clone(at::MemoryFormat::Preserve).requires_grad_(true);
  auto bias = bias0.detach().clone().requires_grad_(true);
  torch::Tensor y;
  if (fused) {
    EXPECT_TRUE(bias_relu_max_pool2_runs_fused(x, bias));
    y = bias_relu_max_pool2(x, bias);
  } else {  // as PyTorch runs a convolution's end: its bias cast to x's dtype (autocast), add, ReLU, pool
    y = torch::max_pool2d(torch::relu(x + bias.to(x.scalar_type()).view({1, -1, 1, 1})), 2);
  }
  y.backward(grad_y);
  return {y.detach(), x.grad(), bias.grad()};
}

// Same values and input gradient as PyTorch's ops to the bit; the bias gradient (a sum in another
// order) to within its dtype's rounding. Inputs on a coarse grid make ties (zeros after ReLU, equal
// values in a window), which checks that the pool picks PyTorch's element.
TEST(GpuFusedLayers, BiasReluMaxPoolEqualsPyTorchsOps_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  torch::manual_seed(0);
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    SCOPED_TRACE(c10::toString(dtype));
    auto x = ((torch::randn({8, 64, 10, 12}, kGpu) * 4).round() / 4 + 0.0).to(dtype).contiguous(at::MemoryFormat::ChannelsLast);
    auto bias = (torch::randn({64}, kGpu) * 4).round() / 4 + 0.0;  // float32, as a layer's parameter (+ 0.0: no -0)
    auto grad_y = torch::randn({8, 64, 5, 6}, kGpu).to(dtype);     // plain NCHW: other strides than y's
    PoolResult fused = run_bias_relu_max_pool2(true, x, bias, grad_y);
    PoolResult reference = run_bias_relu_max_pool2(false, x, bias, grad_y);
    EXPECT_TRUE(test::tensors_equal(fused.y, reference.y));
    EXPECT_TRUE(fused.y.is_contiguous());  // NCHW: flatten(1) is a view
    EXPECT_TRUE(test::tensors_equal(fused.grad_x, reference.grad_x));
    EXPECT_EQ(fused.grad_bias.scalar_type(), torch::kFloat);
    const double tol = dtype == torch::kFloat ? 1e-5 : 1e-2;
    EXPECT_TRUE(test::tensors_close(fused.grad_bias, reference.grad_bias, tol, tol));
    EXPECT_GT(reference.grad_bias.abs().sum().item<double>(), 0.0);
  }
  // What the kernel does not take runs PyTorch's ops: CPU tensors, odd sizes, contiguous NCHW.
  EXPECT_FALSE(bias_relu_max_pool2_runs_fused(torch::randn({2, 64, 6, 6}), torch::randn({64})));
  EXPECT_FALSE(bias_relu_max_pool2_runs_fused(torch::randn({2, 64, 5, 6}, kGpu).contiguous(at::MemoryFormat::ChannelsLast),
                                              torch::randn({64}, kGpu)));
  EXPECT_FALSE(bias_relu_max_pool2_runs_fused(torch::randn({2, 64, 6, 6}, kGpu), torch::randn({64}, kGpu)));
}

// cuDNN in true fp32 (PyTorch lets it use TF32 by default) while the guard lives.
struct NoTf32Guard {
  bool before = at::globalContext().allowTF32CuDNN();
  NoTf32Guard() { at::globalContext().setAllowTF32CuDNN(false); }
  ~NoTf32Guard() { at::globalContext().setAllowTF32CuDNN(before); }
};

// relu(conv2d(x, w, b)) of one-channel images both ways, under each precision: our kernel sums the
// nine products in its own order (cuDNN's is its own), so values and gradients agree to the
// dtype's rounding, not to the bit. The fp32 reference runs without TF32, as our kernel does.
TEST(GpuFusedLayers, OneChannelConvBiasReluMatchesPyTorch_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  NoTf32Guard exact_fp32;
  torch::manual_seed(0);
  auto x = torch::rand({16, 1, 28, 28}, kGpu).contiguous(at::MemoryFormat::ChannelsLast);
  auto weight0 = (torch::randn({32, 1, 3, 3}, kGpu) * 0.3).contiguous(at::MemoryFormat::ChannelsLast);
  auto bias0 = torch::randn({32}, kGpu) * 0.1;
  auto grad_y = torch::randn({16, 32, 26, 26}, kGpu);
  for (Precision precision : {Precision::fp32, Precision::bf16_mixed, Precision::fp16_mixed}) {
    SCOPED_TRACE(to_string(precision));
    std::vector<torch::Tensor> outputs, weight_grads, bias_grads;
    for (bool fused : {true, false}) {
      auto weight = weight0.clone(at::MemoryFormat::Preserve).requires_grad_(true);
      auto bias = bias0.clone().requires_grad_(true);
      torch::Tensor y;
      {
        AutocastGuard autocast(kGpu, precision);
        EXPECT_EQ(conv3x3_bias_relu_runs_fused(x, weight, bias), true);
        y = fused ? conv3x3_bias_relu(x, weight, bias) : torch::relu(torch::conv2d(x, weight, bias));
      }
      y.backward(grad_y.to(y.scalar_type()));
      outputs.push_back(y.detach().to(torch::kFloat));
      weight_grads.push_back(weight.grad());
      bias_grads.push_back(bias.grad());
    }
    const double tol = precision == Precision::fp32 ? 2e-3 : 1e-2;
    EXPECT_TRUE(test::tensors_close(outputs[0], outputs[1], tol, tol));
    EXPECT_TRUE(test::tensors_close(weight_grads[0], weight_grads[1], tol, tol * 10));
    EXPECT_TRUE(test::tensors_close(bias_grads[0], bias_grads[1], tol, tol * 10));
    EXPECT_TRUE(outputs[0].is_contiguous(at::MemoryFormat::ChannelsLast));
  }
  EXPECT_FALSE(conv3x3_bias_relu_runs_fused(x.clone().requires_grad_(true), weight0, bias0));  // would need x's gradient
  EXPECT_FALSE(conv3x3_bias_relu_runs_fused(x.cpu(), weight0.cpu(), bias0.cpu()));
  EXPECT_FALSE(conv3x3_bias_relu_runs_fused(torch::rand({2, 3, 28, 28}, kGpu), weight0, bias0));
}

// ||actual - expected|| / ||expected||, in float64.
double relative_error(const torch::Tensor& actual, const torch::Tensor& expected) {
  auto a = actual.to(torch::kFloat64), e = expected.to(torch::kFloat64);
  return ((a - e).norm() / e.norm()).item<double>();
}

// Both convolutions and the pool in one kernel (and one backward) against PyTorch's layers under
// autocast, for bf16 and fp16 and both weight layouts. The pooled values agree to the dtype's
// rounding: our sums run in another order than cuDNN's, so a window whose two largest values are
// within a rounding of each other may pick the other one. That moves a few gradients to the
// neighbouring position, so the parameters' gradients are compared by relative norm. A wrong tap,
// a transposed weight or a gradient sent to the wrong window is off by the order of 1. The
// gradients are the same from run to run (the images' sums add in a fixed order).
TEST(GpuFusedLayers, MnistFeaturesInOneKernelMatchPyTorchsLayers_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  torch::manual_seed(0);
  const int64_t n = 37;  // not a multiple of the sum's four accumulators
  auto x = torch::rand({n, 1, 28, 28}, kGpu);
  auto w1_0 = torch::randn({32, 1, 3, 3}, kGpu) * 0.3, b1_0 = torch::randn({32}, kGpu) * 0.1;
  auto w2_0 = torch::randn({64, 32, 3, 3}, kGpu) * 0.06, b2_0 = torch::randn({64}, kGpu) * 0.1;
  auto grad_y = torch::randn({n, 64, 12, 12}, kGpu);
  struct Run {
    torch::Tensor y;
    std::vector<torch::Tensor> grads;  // w1, b1, w2, b2
  };
  for (Precision precision : {Precision::bf16_mixed, Precision::fp16_mixed})
    for (bool channels_last : {false, true}) {
      SCOPED_TRACE(to_string(precision) + (channels_last ? ", channels-last weights" : ", contiguous weights"));
      const auto format = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
      auto run = [&](bool ours) {
        std::vector<torch::Tensor> p = {w1_0.contiguous(format), b1_0.clone(), w2_0.contiguous(format), b2_0.clone()};
        for (auto& t : p) t = t.detach().requires_grad_(true);
        torch::Tensor y;
        {
          AutocastGuard autocast(kGpu, precision);
          EXPECT_TRUE(mnist_features_runs_fused(x, p[0], p[1], p[2], p[3]));
          y = ours ? mnist_features(x, p[0], p[1], p[2], p[3])
                   : torch::max_pool2d(torch::relu(torch::conv2d(torch::relu(torch::conv2d(x, p[0], p[1])), p[2], p[3])), 2);
        }
        y.backward(grad_y.to(y.scalar_type()));
        Run r{y.detach(), {}};
        for (auto& t : p) r.grads.push_back(t.grad());
        return r;
      };
      Run ours = run(true), reference = run(false), again = run(true);
      EXPECT_EQ(ours.y.scalar_type(), reference.y.scalar_type());
      EXPECT_TRUE(ours.y.is_contiguous());
      EXPECT_TRUE(test::tensors_close(ours.y, reference.y, 1e-2, 1e-2));
      const char* names[] = {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias"};
      for (size_t i = 0; i < 4; ++i) {
        SCOPED_TRACE(names[i]);
        const double error = relative_error(ours.grads[i], reference.grads[i]);
        std::cout << "  " << names[i] << ": relative error " << error << "\n";
        EXPECT_LT(error, 2e-2);
        EXPECT_EQ(ours.grads[i].scalar_type(), torch::kFloat);
        EXPECT_EQ(ours.grads[i].strides(), reference.grads[i].strides());  // the parameter's layout
        EXPECT_TRUE(test::tensors_equal(ours.grads[i], again.grads[i]));
      }
    }
  // With dropout after the pool (p = 0.25). conv2's bias is raised so that every pooled value is
  // positive: an output is then zero exactly where the kernel's mask dropped it. PyTorch's layers
  // times that mask and 1 / 0.75 must give the same output and gradients; a backward that ignores
  // the mask, or its scale, is off by the order of 1. The same seed draws the same mask.
  for (Precision precision : {Precision::bf16_mixed, Precision::fp16_mixed}) {
    SCOPED_TRACE(to_string(precision) + ", dropout 0.25");
    const auto b2_up = b2_0 + 4;
    torch::Tensor mask;
    auto run = [&](bool ours) {
      std::vector<torch::Tensor> p = {w1_0.clone(), b1_0.clone(), w2_0.clone(), b2_up.clone()};
      for (auto& t : p) t = t.detach().requires_grad_(true);
      torch::Tensor y;
      {
        AutocastGuard autocast(kGpu, precision);
        y = ours ? mnist_features(x, p[0], p[1], p[2], p[3], 0.25)
                 : torch::max_pool2d(torch::relu(torch::conv2d(torch::relu(torch::conv2d(x, p[0], p[1])), p[2], p[3])), 2) *
                       mask * (1 / 0.75);
      }
      y.backward(grad_y.to(y.scalar_type()));
      Run r{y.detach(), {}};
      for (auto& t : p) r.grads.push_back(t.grad());
      return r;
    };
    torch::manual_seed(3);
    Run ours = run(true);
    torch::manual_seed(3);
    Run again = run(true), next = run(true);
    mask = (ours.y != 0).to(ours.y.scalar_type());
    const double kept = mask.to(torch::kFloat).mean().item<double>();
    std::cout << "  kept " << kept << "\n";
    EXPECT_GT(kept, 0.74);
    EXPECT_LT(kept, 0.76);
    Run reference = run(false);
    EXPECT_TRUE(test::tensors_close(ours.y, reference.y, 1e-2, 1e-2));
    EXPECT_TRUE(test::tensors_equal(ours.y, again.y));
    EXPECT_FALSE(test::tensors_equal(ours.y, next.y));  // the generator moved on
    for (size_t i = 0; i < 4; ++i) {
      const double error = relative_error(ours.grads[i], reference.grads[i]);
      std::cout << "  dropout, parameter " << i << ": relative error " << error << "\n";
      EXPECT_LT(error, 2e-2) << "parameter " << i;
      EXPECT_TRUE(test::tensors_equal(ours.grads[i], again.grads[i]));
    }
  }
  // What the kernel does not take runs the layers one by one: fp32, images that need a gradient,
  // another image size, CPU tensors.
  EXPECT_FALSE(mnist_features_runs_fused(x, w1_0, b1_0, w2_0, b2_0));  // no autocast: fp32
  AutocastGuard autocast(kGpu, Precision::bf16_mixed);
  EXPECT_FALSE(mnist_features_runs_fused(x.clone().requires_grad_(true), w1_0, b1_0, w2_0, b2_0));
  EXPECT_FALSE(mnist_features_runs_fused(torch::rand({2, 1, 27, 27}, kGpu), w1_0, b1_0, w2_0, b2_0));
  EXPECT_FALSE(mnist_features_runs_fused(x.cpu(), w1_0.cpu(), b1_0.cpu(), w2_0.cpu(), b2_0.cpu()));
}

// fc1's ReLU, the dropout, fc2 and log-softmax in one kernel (and one backward) against PyTorch's ops
// under autocast, for bf16 and fp16, on 77 and 300 rows (not multiples of a block's warps). Without
// dropout the log-probabilities agree to a rounding of fc2's 16-bit output, and the gradients by
// relative norm. With dropout the kernel draws its own mask; h > 0 there, so the mask is where h's
// gradient is not zero. It must keep about half, and PyTorch's ops with that mask (times 2, exact in
// the dtype) must give the same output and gradients: a backward that draws another mask than the
// forward, or drops the scale, is off by the order of 1. The same seed draws the same mask (exact
// resume), the next call another.
TEST(GpuFusedLayers, MnistHeadInOneKernelMatchesPyTorchsLayers_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  torch::manual_seed(0);
  auto w2_0 = torch::randn({10, 128}, kGpu) * 0.1, b2_0 = torch::randn({10}, kGpu) * 0.1;
  struct Run {
    torch::Tensor y;
    std::vector<torch::Tensor> grads;  // h, w2, b2
  };
  for (int64_t n : {77, 300})  // 300: the backward's three chunks of rows, the last one short
  for (Precision precision : {Precision::bf16_mixed, Precision::fp16_mixed}) {
    const auto dtype = precision == Precision::bf16_mixed ? torch::kBFloat16 : torch::kHalf;
    const auto grad_out = torch::randn({n, 10}, kGpu);
    for (double p : {0.0, 0.5}) {
      SCOPED_TRACE(std::to_string(n) + " rows, " + to_string(precision) + ", p = " + std::to_string(p));
      // with dropout, h > 0: ReLU passes everything and h's gradient shows the mask
      const auto h0 = (p > 0 ? torch::rand({n, 128}, kGpu) + 0.1 : torch::randn({n, 128}, kGpu) * 3).to(dtype);
      torch::Tensor mask;  // PyTorch's side applies ours
      auto run = [&](bool ours) {
        auto h = h0.clone().requires_grad_(true);
        auto w2 = w2_0.clone().requires_grad_(true), b2 = b2_0.clone().requires_grad_(true);
        torch::Tensor y;
        {
          AutocastGuard autocast(kGpu, precision);
          EXPECT_TRUE(mnist_head_runs_fused(h, w2, b2));
          auto kept = torch::relu(h);
          if (!ours && p > 0) kept = kept * mask * 2;
          y = ours ? mnist_head(h, w2, b2, p) : torch::log_softmax(torch::linear(kept, w2, b2), 1);
        }
        y.backward(grad_out);
        return Run{y.detach(), {h.grad(), w2.grad(), b2.grad()}};
      };
      torch::manual_seed(7);
      Run ours = run(true);
      torch::manual_seed(7);
      Run again = run(true), next = run(true);
      mask = (ours.grads[0] != 0).to(dtype);
      Run reference = run(false);
      if (p > 0) {
        const double kept = mask.to(torch::kFloat).mean().item<double>();
        std::cout << "  kept " << kept << " of h\n";
        EXPECT_GT(kept, 0.46);
        EXPECT_LT(kept, 0.54);
        EXPECT_FALSE(test::tensors_equal(next.y, ours.y));  // the generator moved on
      }
      EXPECT_EQ(ours.y.scalar_type(), torch::kFloat);
      EXPECT_TRUE(test::tensors_close(ours.y, reference.y, 2e-2, 2e-2));
      const char* names[] = {"h", "fc2.weight", "fc2.bias"};
      for (size_t i = 0; i < 3; ++i) {
        SCOPED_TRACE(names[i]);
        const double error = relative_error(ours.grads[i], reference.grads[i]);
        std::cout << "  " << names[i] << ": relative error " << error << "\n";
        EXPECT_LT(error, 2e-2);
        EXPECT_EQ(ours.grads[i].scalar_type(), reference.grads[i].scalar_type());
        EXPECT_TRUE(test::tensors_equal(ours.grads[i], again.grads[i]));  // same seed, same bits
      }
      EXPECT_TRUE(test::tensors_equal(ours.y, again.y));
    }
  }
  // What the kernel does not take runs PyTorch's ops: no autocast, another width, CPU tensors.
  const auto h = torch::randn({77, 128}, kGpu).to(torch::kBFloat16);
  EXPECT_FALSE(mnist_head_runs_fused(h, w2_0, b2_0));  // no autocast
  AutocastGuard autocast(kGpu, Precision::bf16_mixed);
  EXPECT_FALSE(mnist_head_runs_fused(h.narrow(1, 0, 64).contiguous(), w2_0.narrow(1, 0, 64).contiguous(), b2_0));
  EXPECT_FALSE(mnist_head_runs_fused(h.cpu(), w2_0.cpu(), b2_0.cpu()));
  EXPECT_FALSE(mnist_head_runs_fused(h.to(torch::kHalf), w2_0, b2_0));  // not autocast's dtype
}

// The fast path's linear under autocast against torch::linear under autocast: the same output and
// input gradient to the bit (the same cuBLAS calls); the weight and bias gradients in float32, equal
// to the float sums of the same 16-bit values (autocast's path rounds them to the dtype first, so
// it is within the dtype's rounding of ours). A gradient of the wrong layout, a missing bias
// gradient or one summed over the wrong axis is off by the order of 1.
TEST(GpuFusedLayers, LinearWritesFloatGradientsOfAutocastsLinear_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  torch::manual_seed(0);
  auto x0 = torch::randn({128, 256}, kGpu), w0 = torch::randn({64, 256}, kGpu) * 0.05, b0 = torch::randn({64}, kGpu) * 0.1;
  auto grad_y = torch::randn({128, 64}, kGpu);
  for (Precision precision : {Precision::bf16_mixed, Precision::fp16_mixed}) {
    SCOPED_TRACE(to_string(precision));
    const auto dtype = precision == Precision::bf16_mixed ? torch::kBFloat16 : torch::kHalf;
    std::vector<std::vector<torch::Tensor>> runs;  // y, x's, w's and b's gradients
    for (bool ours : {true, false}) {
      auto x = x0.to(dtype).requires_grad_(true);
      auto w = w0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
      torch::Tensor y;
      {
        AutocastGuard autocast(kGpu, precision);
        EXPECT_TRUE(linear_runs_fused(x, w, b));
        y = ours ? linear(x, w, b) : torch::linear(x, w, b);
      }
      y.backward(grad_y.to(y.scalar_type()));
      runs.push_back({y.detach(), x.grad(), w.grad(), b.grad()});
    }
    EXPECT_TRUE(test::tensors_equal(runs[0][0], runs[1][0]));
    EXPECT_TRUE(test::tensors_equal(runs[0][1], runs[1][1]));
    const auto g = grad_y.to(dtype).to(torch::kFloat), x = x0.to(dtype).to(torch::kFloat);
    EXPECT_EQ(runs[0][2].scalar_type(), torch::kFloat);
    EXPECT_TRUE(test::tensors_close(runs[0][2], g.t().mm(x), 1e-4, 1e-4));
    EXPECT_TRUE(test::tensors_close(runs[0][3], g.sum(0), 1e-4, 1e-4));
    EXPECT_TRUE(test::tensors_close(runs[0][2], runs[1][2], 1e-2, 1e-3));
    EXPECT_TRUE(test::tensors_close(runs[0][3], runs[1][3], 1e-2, 1e-3));
  }
  // fp32 (no autocast), float input under autocast and CPU tensors run torch::linear.
  EXPECT_FALSE(linear_runs_fused(x0.to(torch::kBFloat16), w0, b0));
  AutocastGuard autocast(kGpu, Precision::bf16_mixed);
  EXPECT_FALSE(linear_runs_fused(x0, w0, b0));
  EXPECT_FALSE(linear_runs_fused(x0.cpu().to(torch::kBFloat16), w0.cpu(), b0.cpu()));
}

// The MNIST network on its fused path gives the textbook layers' loss and gradients (bf16
// autocast, channels-last, dropout off so both see the same activations), to bf16's rounding.
TEST(GpuFusedLayers, MnistNetFusedEqualsTextbookLayers_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  torch::manual_seed(0);
  MnistNet textbook, fused = make_fused_mnist_net();
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < textbook->parameters().size(); ++i) fused->parameters()[i].copy_(textbook->parameters()[i]);
  }
  auto x = torch::randn({64, 1, 28, 28}, kGpu).contiguous(at::MemoryFormat::ChannelsLast);
  auto target = torch::randint(0, 10, {64}, torch::dtype(torch::kInt64).device(kGpu));
  std::vector<std::vector<torch::Tensor>> grads;
  std::vector<torch::Tensor> losses;
  for (MnistNet net : {fused, textbook}) {
    net->to(kGpu);
    to_channels_last(*net);
    net->eval();
    net->zero_grad();
    torch::Tensor loss;
    {
      AutocastGuard autocast(kGpu, Precision::bf16_mixed);
      loss = torch::nll_loss(net->forward(x), target);
    }
    loss.backward();
    losses.push_back(loss.detach());
    grads.emplace_back();
    for (auto& p : net->parameters()) grads.back().push_back(p.grad().clone());
  }
  EXPECT_TRUE(test::tensors_close(losses[0], losses[1], 1e-3, 1e-3));
  for (size_t i = 0; i < grads[0].size(); ++i)
    EXPECT_TRUE(test::tensors_close(grads[0][i], grads[1][i], 5e-2, 2e-3)) << textbook->named_parameters()[i].key();
}

// ---- A transformer's residual step in one kernel ----------------------------------------------------

// Without dropout, x + branch and its LayerNorm (then cast to the branch's dtype, as autocast casts
// it for the next matmul) against PyTorch's ops through autograd: the sum to the bit, the rest to
// the dtype's rounding, for each dtype and for one, three and eight quads a lane.
TEST(GpuFusedResidualNorm, EqualsPyTorchsOpsWithoutDropout_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  torch::manual_seed(0);
  for (int64_t width : {128, 384, 1024}) {
    for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
      SCOPED_TRACE(std::to_string(width) + " " + c10::toString(dtype));
      const auto x0 = torch::randn({4, 33, width}, kGpu) * 3 + 1;  // a mean far from 0
      const auto branch0 = torch::randn({4, 33, width}, kGpu).to(dtype);
      const auto weight0 = torch::rand({width}, kGpu) + 0.5;
      const auto grad_sum = torch::randn({4, 33, width}, kGpu);
      const auto grad_normed = torch::randn({4, 33, width}, kGpu).to(dtype);
      ASSERT_TRUE(dropout_add_layer_norm_runs_fused(x0, branch0, weight0));
      std::vector<torch::Tensor> fused, reference;
      for (bool ours : {true, false}) {
        auto x = x0.clone().requires_grad_(true), branch = branch0.clone().requires_grad_(true);
        auto weight = weight0.clone().requires_grad_(true);
        torch::Tensor sum, normed;
        if (ours) {
          std::tie(sum, normed) = dropout_add_layer_norm(x, branch, weight, /*p=*/0.0);
        } else {
          sum = x + branch;
          normed = torch::layer_norm(sum, {width}, weight, {}, 1e-5).to(dtype);
        }
        torch::autograd::backward({sum, normed}, {grad_sum, grad_normed});
        std::vector<torch::Tensor> results{sum.detach(), normed.detach(), x.grad(), branch.grad(), weight.grad()};
        (ours ? fused : reference) = std::move(results);
      }
      EXPECT_EQ(fused[1].scalar_type(), dtype);
      EXPECT_TRUE(test::tensors_equal(fused[0], reference[0]));
      const double tol = dtype == torch::kFloat ? 1e-5 : 1e-2;  // one rounding of a bf16/fp16 value
      EXPECT_TRUE(test::tensors_close(fused[1].to(torch::kFloat), reference[1].to(torch::kFloat), tol, tol));
      EXPECT_TRUE(test::tensors_close(fused[2], reference[2], 1e-4, 1e-4));
      EXPECT_TRUE(test::tensors_close(fused[3].to(torch::kFloat), reference[3].to(torch::kFloat), tol, 1e-4));
      EXPECT_TRUE(test::tensors_close(fused[4], reference[4], 1e-3, 1e-3));
    }
  }
  // Without x (the embeddings' dropout and the first LayerNorm): the sum is the branch in float32.
  const auto on_gpu = torch::TensorOptions().device(kGpu);
  auto branch = torch::randn({64, 384}, on_gpu).to(torch::kBFloat16).requires_grad_(true);
  const auto weight = torch::rand({384}, on_gpu) + 0.5;
  ASSERT_TRUE(dropout_add_layer_norm_runs_fused({}, branch, weight));
  auto [sum, normed] = dropout_add_layer_norm({}, branch, weight, 0.0);
  EXPECT_EQ(sum.scalar_type(), torch::kFloat);
  EXPECT_TRUE(test::tensors_equal(sum, branch.detach().to(torch::kFloat)));
  EXPECT_TRUE(test::tensors_close(normed.to(torch::kFloat), torch::layer_norm(sum, {384}, weight, {}, 1e-5), 1e-2, 1e-2));
  sum.sum().backward();
  EXPECT_TRUE(test::tensors_equal(branch.grad(), torch::ones_like(branch)));
  // What the kernel does not take runs PyTorch's ops: CPU tensors, widths not of 128s, a strided x.
  EXPECT_FALSE(dropout_add_layer_norm_runs_fused(torch::randn({2, 384}), torch::randn({2, 384}), torch::ones({384})));
  EXPECT_FALSE(dropout_add_layer_norm_runs_fused(torch::randn({2, 96}, on_gpu), torch::randn({2, 96}, on_gpu),
                                                 torch::ones({96}, on_gpu)));
  EXPECT_FALSE(dropout_add_layer_norm_runs_fused(torch::randn({384, 2}, on_gpu).t(), torch::randn({2, 384}, on_gpu),
                                                 torch::ones({384}, on_gpu)));
}

// With dropout: each element of the sum is x or x + branch / (1 - p); about 1 - p of them are kept;
// the backward lets the gradient through exactly where the forward kept the branch (the mask drawn
// again, never stored); normed is the LayerNorm of the sum; a second call draws another mask and
// the same seed the same one.
TEST(GpuFusedResidualNorm, TheBackwardDrawsTheForwardsMask_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  const double p = 0.2;
  const auto x = torch::randn({64, 256, 384}, kGpu);
  const auto branch0 = torch::rand({64, 256, 384}, kGpu) + 0.5;  // never 0: a dropped element shows
  const auto weight = torch::ones({384}, kGpu);
  auto run = [&](uint64_t seed) {
    torch::manual_seed(seed);
    auto branch = branch0.clone().requires_grad_(true);
    auto [sum, normed] = dropout_add_layer_norm(x, branch, weight, p);
    torch::autograd::backward({sum}, {torch::ones_like(sum)});  // grad_normed: none, as for ln_f's input
    return std::make_tuple(sum.detach(), normed.detach(), branch.grad());
  };
  auto [sum, normed, grad_branch] = run(7);
  const auto kept = sum != x;
  const double kept_share = kept.to(torch::kFloat).mean().item<double>();
  EXPECT_NEAR(kept_share, 1 - p, 0.005) << "6.3 M draws: 0.005 is over 20 standard deviations";
  EXPECT_TRUE(test::tensors_close(torch::where(kept, sum - x, torch::zeros_like(x)),
                                  torch::where(kept, branch0 / (1 - p), torch::zeros_like(x)), 1e-5, 1e-5));
  EXPECT_TRUE(torch::equal(grad_branch != 0, kept)) << "the backward's mask is not the forward's";
  EXPECT_TRUE(test::tensors_close(torch::where(kept, grad_branch, torch::zeros_like(x)),
                                  torch::where(kept, torch::full_like(x, 1 / (1 - p)), torch::zeros_like(x)), 1e-6, 1e-6));
  EXPECT_TRUE(test::tensors_close(normed, torch::layer_norm(sum, {384}, weight, {}, 1e-5), 1e-5, 1e-5));
  auto [again, unused1, unused2] = run(7);
  EXPECT_TRUE(torch::equal(again, sum)) << "the same seed, another mask";
  auto [other, unused3, unused4] = run(8);
  EXPECT_FALSE(torch::equal(other != x, kept)) << "another seed, the same mask";
}

// Captured in a CUDA graph (the fast path's step), every replay draws a new mask (the generator's
// offset advances per replay) and that replay's backward draws the same one.
TEST(GpuFusedResidualNorm, EachGraphReplayDrawsAMaskItsBackwardFollows_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  const double p = 0.5;
  const auto x = torch::zeros({256, 128}, kGpu);
  const auto branch = torch::ones({256, 128}, kGpu);
  const auto weight = torch::ones({128}, kGpu);
  const auto grad_sum = torch::ones({256, 128}, kGpu);
  at::cuda::CUDAGraph graph;
  cuda::ResidualNormSaved saved;
  cuda::ResidualNormGrads grads;
  {
    c10::cuda::CUDAStreamGuard side(c10::cuda::getStreamFromPool());
    graph.capture_begin();
    saved = cuda::dropout_add_layer_norm_forward(x, branch, weight, p, 1e-5);
    grads = cuda::dropout_add_layer_norm_backward(grad_sum, {}, saved, weight, p);
    graph.capture_end();
  }
  std::vector<torch::Tensor> masks;
  for (int replay = 0; replay < 2; ++replay) {
    graph.replay();
    torch::cuda::synchronize();
    masks.push_back(saved.sum != 0);
    EXPECT_TRUE(torch::equal(grads.branch != 0, masks.back())) << "replay " << replay;
  }
  EXPECT_FALSE(torch::equal(masks[0], masks[1])) << "two replays drew the same mask";
}

// The MNIST network's two dropouts inside our kernels, captured in a CUDA graph (the fast path's
// step): every replay draws new masks, and that replay's backward follows them. The features
// kernel's mask is bit 3 of its route (conv2's bias raised: an output is zero exactly where it was
// dropped); the head's is where h's gradient is zero (h > 0), and its log-probabilities must be
// those of PyTorch's ops with that mask.
TEST(GpuFusedLayers, EachGraphReplayDrawsTheMnistDropoutsAgain_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  torch::manual_seed(0);
  const auto x = torch::rand({8, 1, 28, 28}, kGpu);
  const auto w1 = torch::randn({32, 1, 3, 3}, kGpu) * 0.3, b1 = torch::randn({32}, kGpu) * 0.1;
  const auto w2 = torch::randn({64, 32, 3, 3}, kGpu) * 0.06, b2 = torch::randn({64}, kGpu) * 0.1 + 4;
  const auto grad_y = torch::randn({8, 64, 12, 12}, kGpu).to(torch::kBFloat16);
  const auto h = (torch::rand({32, 128}, kGpu) + 0.1).to(torch::kBFloat16);
  const auto fc2_w = torch::randn({10, 128}, kGpu) * 0.1, fc2_b = torch::randn({10}, kGpu) * 0.1;
  const auto grad_log_probs = torch::randn({32, 10}, kGpu);
  ASSERT_TRUE(cuda::mnist_features_supported(x, w1, b1, w2, b2, torch::kBFloat16));
  ASSERT_TRUE(cuda::mnist_head_supported(h, fc2_w, fc2_b));
  at::cuda::CUDAGraph graph;
  cuda::MnistFeatures features;
  cuda::MnistFeatureGrads feature_grads;
  cuda::MnistHead head;
  cuda::MnistHeadGrads head_grads;
  {
    c10::cuda::CUDAStreamGuard side(c10::cuda::getStreamFromPool());
    graph.capture_begin();
    features = cuda::mnist_features_forward(x, w1, b1, w2, b2, torch::kBFloat16, 0.25);
    feature_grads = cuda::mnist_features_backward(grad_y, features.route, x, w1, b1, w2, b2, torch::kBFloat16, 0.25);
    head = cuda::mnist_head_forward(h, fc2_w, fc2_b, 0.5);
    head_grads = cuda::mnist_head_backward(grad_log_probs, head, h, fc2_w, 0.5);
    graph.capture_end();
  }
  std::vector<torch::Tensor> feature_masks, head_masks;
  for (int replay = 0; replay < 2; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    graph.replay();
    torch::cuda::synchronize();
    feature_masks.push_back(features.route.bitwise_and(8) != 0);
    EXPECT_TRUE(torch::equal(features.y != 0, feature_masks.back()));
    head_masks.push_back(head_grads.h != 0);
    const auto kept = (torch::relu(h) * head_masks.back() * 2).to(torch::kFloat);
    const auto logits = (kept.matmul(fc2_w.to(torch::kBFloat16).to(torch::kFloat).t()) +
                         fc2_b.to(torch::kBFloat16).to(torch::kFloat))
                            .to(torch::kBFloat16)
                            .to(torch::kFloat);
    EXPECT_TRUE(test::tensors_close(head.log_probs, torch::log_softmax(logits, 1), 2e-2, 2e-2));
  }
  EXPECT_FALSE(torch::equal(feature_masks[0], feature_masks[1])) << "two replays drew the same mask";
  EXPECT_FALSE(torch::equal(head_masks[0], head_masks[1])) << "two replays drew the same mask";
}

// An fp8 tensor's bytes, to compare bit for bit.
torch::Tensor bytes_of(const torch::Tensor& fp8) { return fp8.view(torch::kUInt8); }

// The FP8 cast kernel against PyTorch's ops, bit for bit, for each way it takes its input and both
// formats: saturated values (a scale that pushes some past the format's largest), subnormals,
// zeros; the transposed copy is the transpose; amax is the largest |value| it cast, and only rises.
TEST(GpuFusedFp8Mlp, CastEqualsPyTorchsOpsToTheBit_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  torch::manual_seed(0);
  using cuda::Fp8CastInput;
  const auto x32 = torch::randn({192, 320}, kGpu) * torch::rand({192, 1}, kGpu).pow(4) * 50;  // rows from tiny to large
  const auto gate = torch::randn({192, 320}, kGpu).to(torch::kBFloat16).masked_fill(torch::rand({192, 320}, kGpu) < 0.1, 0);
  for (auto format : {torch::kFloat8_e4m3fn, torch::kFloat8_e5m2}) {
    const double limit = format == torch::kFloat8_e4m3fn ? 448.0 : 57344.0;
    for (auto input : {Fp8CastInput::plain, Fp8CastInput::round_bf16, Fp8CastInput::relu, Fp8CastInput::gated}) {
      for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
        if (input == Fp8CastInput::round_bf16 && dtype != torch::kFloat) continue;
        SCOPED_TRACE(std::string(c10::toString(format)) + " input " + std::to_string(static_cast<int>(input)) + " " +
                     c10::toString(dtype));
        const auto x = x32.to(dtype);
        torch::Tensor values = x.to(torch::kFloat32);
        if (input == Fp8CastInput::round_bf16) values = x.to(torch::kBFloat16).to(torch::kFloat32);
        if (input == Fp8CastInput::relu) values = torch::relu(values);
        if (input == Fp8CastInput::gated) values = values.masked_fill(gate <= 0, 0);
        const auto amax_expected = values.abs().max();
        const auto scale = (limit / amax_expected * 4).reshape({});  // the largest quarter saturates
        const auto expected = (values * scale).clamp(-limit, limit).to(format);
        auto out = torch::empty({192, 320}, x.options().dtype(format));
        auto out_t = torch::empty({320, 192}, x.options().dtype(format));
        auto amax = torch::full({}, 0.5f, torch::TensorOptions().device(kGpu));  // below the true amax: raised
        ASSERT_TRUE(cuda::fp8_cast_supported(x, input == Fp8CastInput::gated ? gate : torch::Tensor()));
        cuda::fp8_cast(x, input, input == Fp8CastInput::gated ? gate : torch::Tensor(), scale, out, out_t, amax);
        EXPECT_TRUE(torch::equal(bytes_of(out), bytes_of(expected)));
        EXPECT_TRUE(torch::equal(bytes_of(out_t), bytes_of(expected.t().contiguous())));
        EXPECT_EQ(amax.item<float>(), amax_expected.item<float>());
        auto higher = torch::full({}, 1e30f, torch::TensorOptions().device(kGpu));
        cuda::fp8_cast(x, input, input == Fp8CastInput::gated ? gate : torch::Tensor(), scale, {}, {}, higher);
        EXPECT_EQ(higher.item<float>(), 1e30f) << "amax went down";
      }
    }
  }
  EXPECT_FALSE(cuda::fp8_cast_supported(torch::randn({192, 80}, kGpu), {})) << "80 columns: not whole tiles";
  EXPECT_FALSE(cuda::fp8_cast_supported(torch::randn({320, 192}, kGpu).t(), {})) << "not contiguous";
}

// The FP8 MLP on our kernels equals the same MLP on PyTorch's ops (Fp8ReluMlp's reference) to the
// bit, over steps that change the weights and the input's range, with a history of 2 steps that
// wraps around: outputs, the input's and the weights' gradients, and every step's scales. One
// layer's width (80) is not whole tiles: its casts run PyTorch's ops in both.
TEST(GpuFusedFp8Mlp, EqualsItsPyTorchOpsToTheBit_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  if (at::cuda::getCurrentDeviceProperties()->major * 10 + at::cuda::getCurrentDeviceProperties()->minor < 89)
    GTEST_SKIP() << "no FP8 matmul on this GPU (compute capability 8.9 or newer)";
  torch::manual_seed(0);
  const auto x0 = torch::randn({256, 512}, kGpu);
  const std::vector<torch::Tensor> w0 = {torch::randn({384, 512}, kGpu) * 0.05, torch::randn({80, 384}, kGpu) * 0.05,
                                         torch::randn({128, 80}, kGpu) * 0.1};
  std::vector<torch::Tensor> seen[2];
  for (int kernels : {1, 0}) {
    Fp8ReluMlp mlp(/*history=*/2, kernels == 1);
    std::vector<torch::Tensor> weights;
    for (const auto& w : w0) weights.push_back(w.clone().requires_grad_(true));
    for (double range : {1.0, 8.0, 1.0, 1.0}) {
      const auto x = (x0 * range).requires_grad_(true);
      const auto y = mlp.forward(x, weights);
      (y.to(torch::kFloat32) * torch::linspace(-1, 1, 128, kGpu)).sum().backward();
      seen[kernels].insert(seen[kernels].end(), {y.detach(), x.grad(), mlp.scales().clone()});
      torch::NoGradGuard no_grad;
      for (auto& w : weights) {
        seen[kernels].push_back(w.grad().clone());
        w -= 0.05 * w.grad() / w.grad().abs().max();
        w.mutable_grad() = torch::Tensor();
      }
    }
  }
  ASSERT_EQ(seen[0].size(), seen[1].size());
  for (size_t i = 0; i < seen[0].size(); ++i) {
    ASSERT_TRUE(seen[1][i].defined()) << i;
    EXPECT_TRUE(torch::equal(seen[1][i], seen[0][i])) << "tensor " << i << " (per step: y, x's grad, scales, 3 weights' grads)";
  }
}

TEST(GpuMonitorCuda, ReadsTheClockAndPowerWhileMatmulsRun_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  GpuMonitor monitor(kGpu);
  if (!monitor.available()) GTEST_SKIP() << "NVML (libnvidia-ml.so.1) is not loadable here";
  auto a = torch::randn({4096, 4096}, kGpu).to(torch::kBFloat16);
  monitor.start();
  Stopwatch watch;
  while (watch.seconds() < 0.3) {
    for (int i = 0; i < 20; ++i) a = torch::mm(a, a).div_(64);
    torch::cuda::synchronize();
  }
  auto reading = monitor.stop();
  ASSERT_TRUE(reading.has_value());
  EXPECT_GE(reading->samples, 5u);
  EXPECT_GT(reading->sm_mhz, 100);    // a working GPU clocks in hundreds of MHz at least
  EXPECT_LT(reading->sm_mhz, 5000);
  EXPECT_GT(reading->watts, 10);
  EXPECT_GE(reading->power_capped, 0.0);
  EXPECT_LE(reading->power_capped, 1.0);
  EXPECT_FALSE(monitor.stop().has_value());  // the samples went with the first reading
}

}  // namespace
}  // namespace amplab
