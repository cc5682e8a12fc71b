// Graded tests of lab 1 (GPU basics). Each test names the TODO it grades; every one fails on the
// untouched starter (AMPLAB_TODO throws) and passes on a correct solution. Tests named *_CUDA
// need a GPU and are skipped without one.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/Parallel.h>
#include <ATen/cuda/CUDAContext.h>

#include <chrono>
#include <thread>

#include "amplab/infra/env.hpp"
#include "gpu_basics.hpp"
#include "support.hpp"

namespace {

struct TwoLayer : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
  TwoLayer() {
    fc1 = register_module("fc1", torch::nn::Linear(4, 8));
    norm = register_module("norm", torch::nn::BatchNorm1d(8));
    fc2 = register_module("fc2", torch::nn::Linear(8, 2));
  }
};

// TODO(gpu_basics-1)
TEST(GpuBasics1_DescribeDevice, CpuReportHasTheCpuModelAndThreads) {
  auto report = gpu_basics::describe_device(torch::kCPU);
  EXPECT_EQ(report.device, "cpu");
  EXPECT_EQ(report.name, amplab::cpu_model_name());
  EXPECT_EQ(report.cpu_threads, at::get_num_threads());
  EXPECT_EQ(report.multiprocessors, 0);
  EXPECT_EQ(report.compute_capability, "");
  EXPECT_EQ(report.cuda_runtime, "13.0");  // the CUDA runtime torch was built with, GPU or not
}

TEST(GpuBasics1_DescribeDevice, GpuReport_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  auto report = gpu_basics::describe_device(torch::Device(torch::kCUDA, 0));
  const auto* props = at::cuda::getDeviceProperties(0);
  EXPECT_EQ(report.name, props->name);
  EXPECT_EQ(report.multiprocessors, props->multiProcessorCount);
  EXPECT_EQ(report.compute_capability, std::to_string(props->major) + "." + std::to_string(props->minor));
  EXPECT_GT(report.memory_gib, 1.0);
  EXPECT_FALSE(report.cudnn.empty());
}

// TODO(gpu_basics-2)
// Parameters and buffers on two devices: the meta device (shapes without storage) stands in for a
// GPU where there is none. (LibTorch cannot move a module to meta, so they are created there.)
struct Mixed : torch::nn::Module {
  Mixed() {
    register_parameter("a", torch::zeros({2}));
    register_parameter("b", torch::zeros({2}, torch::kMeta));
    register_module("inner", std::make_shared<TwoLayer>());
    register_buffer("c", torch::zeros({2}, torch::kMeta));
    register_buffer("d", torch::zeros({2}));
  }
};

TEST(GpuBasics2_Placement, FindsTensorsOnAnotherDevice) {
  Mixed model;
  EXPECT_EQ(gpu_basics::tensors_not_on(model, torch::kCPU), (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(gpu_basics::tensors_not_on(model, torch::kMeta),
            (std::vector<std::string>{"a", "inner.fc1.weight", "inner.fc1.bias", "inner.norm.weight", "inner.norm.bias",
                                      "inner.fc2.weight", "inner.fc2.bias", "d", "inner.norm.running_mean",
                                      "inner.norm.running_var", "inner.norm.num_batches_tracked"}));
}

TEST(GpuBasics2_Placement, MoveToTheSameDeviceKeepsEverything) {
  TwoLayer model;
  gpu_basics::move_to_device(model, torch::kCPU);
  EXPECT_TRUE(gpu_basics::tensors_not_on(model, torch::kCPU).empty());
  EXPECT_EQ(model.fc1->weight.scalar_type(), torch::kFloat);
}

TEST(GpuBasics2_Placement, MoveToGpu_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  TwoLayer model;
  gpu_basics::move_to_device(model, torch::Device(torch::kCUDA, 0));
  EXPECT_TRUE(gpu_basics::tensors_not_on(model, torch::Device(torch::kCUDA, 0)).empty());
  EXPECT_EQ(gpu_basics::tensors_not_on(model, torch::kCPU).size(), 9u);
}

// TODO(gpu_basics-3)
TEST(GpuBasics3_Mismatch, ExplainsAndNamesBothDevices) {
  auto cpu = torch::ones({2});
  auto meta = torch::ones({2}, torch::kMeta);
  std::string why = gpu_basics::explain_device_mismatch(cpu, meta);
  EXPECT_NE(why.find("cpu"), std::string::npos) << why;
  EXPECT_NE(why.find("meta"), std::string::npos) << why;
  EXPECT_NE(why.find(".to("), std::string::npos) << why;
}

TEST(GpuBasics3_Mismatch, SameDeviceIsFine) {
  EXPECT_EQ(gpu_basics::explain_device_mismatch(torch::ones({2}), torch::ones({2})), "");
}

// TODO(gpu_basics-4)
TEST(GpuBasics4_Timing, RunsWarmupThenTimesEachRepeat) {
  int calls = 0;
  auto summary = gpu_basics::time_on_device(
      [&] {
        ++calls;
        std::this_thread::sleep_for(std::chrono::milliseconds(3));
      },
      torch::kCPU, /*warmup=*/2, /*repeats=*/5);
  EXPECT_EQ(calls, 7);
  EXPECT_EQ(summary.count, 5u);
  EXPECT_GE(summary.min, 3.0);  // each repeat is at least the sleep: timed one by one, in ms
  EXPECT_LE(summary.q1, summary.median);
  EXPECT_LE(summary.median, summary.q3);
}

TEST(GpuBasics4_Timing, EventsSeeWorkTheHostClockMisses_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  torch::Device gpu(torch::kCUDA, 0);
  auto a = torch::randn({4096, 4096}, gpu);
  auto work = [&] { for (int i = 0; i < 5; ++i) torch::mm(a, a); };
  auto right = gpu_basics::time_on_device(work, gpu, 2, 5);
  // 5 x 137 GFLOP takes milliseconds even on an H200, whatever the launch cost.
  EXPECT_GT(right.median, 0.5);
}

// TODO(gpu_basics-5)
TEST(GpuBasics5_Bandwidth, CpuCopyGivesAFiniteRate) {
  auto source = torch::ones({1 << 20});
  double gbs = gpu_basics::copy_bandwidth_gbs(source, torch::kCPU, 1, 3);
  EXPECT_TRUE(std::isfinite(gbs));
  EXPECT_GT(gbs, 0.01);
  EXPECT_LT(gbs, 10000.0);
}

TEST(GpuBasics5_Bandwidth, PinnedHostToDeviceBeatsPageable_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  auto pageable = torch::ones({64 << 20}, torch::kUInt8);
  auto pinned = pageable.pin_memory();
  torch::Device gpu(torch::kCUDA, 0);
  double slow = gpu_basics::copy_bandwidth_gbs(pageable, gpu, 2, 5);
  double fast = gpu_basics::copy_bandwidth_gbs(pinned, gpu, 2, 5);
  EXPECT_GT(fast, 1.0);
  EXPECT_GT(slow, 0.1);
}

// TODO(gpu_basics-6)
TEST(GpuBasics6_Matmul, FlopCount) {
  EXPECT_EQ(gpu_basics::matmul_flops(2, 3, 4), 48);
  EXPECT_EQ(gpu_basics::matmul_flops(8192, 8192, 8192), 2LL * 8192 * 8192 * 8192);
}

TEST(GpuBasics6_Matmul, CpuThroughputIsFinite) {
  double tflops = gpu_basics::matmul_tflops(128, torch::kFloat32, torch::kCPU, false, 1, 3);
  EXPECT_TRUE(std::isfinite(tflops));
  EXPECT_GT(tflops, 0.0);
  EXPECT_LT(tflops, 100.0);  // no CPU does 100 TFLOP/s in fp32
}

}  // namespace
