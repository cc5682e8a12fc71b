// The GPU timeline on a real GPU: samples at its period, phases in order, gpu_monitor.csv as written.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "amplab/measure/gpu_timeline.hpp"

namespace amplab {
namespace {

TEST(GpuTimelineCuda, SamplesEachPhaseAndWritesEverySampleToTheCsv_CUDA) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto csv = std::filesystem::temp_directory_path() / "amplab_gpu_timeline.csv";
  GpuTimeline timeline(torch::Device(torch::kCUDA, 0), csv.string(), std::chrono::milliseconds(20));
  if (!timeline.available()) GTEST_SKIP() << "NVML not available";
  timeline.phase("idle");
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  timeline.phase("matmuls");
  auto a = torch::randn({4096, 4096}, torch::kCUDA);
  auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(1500)) {
    a = torch::mm(a, a).clamp(-1, 1);
    torch::cuda::synchronize();
  }
  timeline.stop();
  auto phases = timeline.phases();
  ASSERT_GE(phases.size(), 2u);
  auto idle = timeline.phase_stats("idle"), busy = timeline.phase_stats("matmuls");
  ASSERT_TRUE(idle && busy);
  EXPECT_GE(busy->samples, 40);  // 1.5 s at 20 ms
  EXPECT_GT(busy->sm_util_mean_pct, idle->sm_util_mean_pct);
  EXPECT_GT(busy->sm_util_mean_pct, 50);
  EXPECT_GT(busy->power_mean_w, 0);
  EXPECT_GT(busy->memory_used_max_mib, 64);  // the two 64 MiB matrices at least
  std::ifstream in(csv);
  std::string header, line;
  std::getline(in, header);
  EXPECT_EQ(header, "time_s,phase,sm_util_pct,memory_util_pct,memory_used_mib,power_w,sm_clock_mhz,temperature_c");
  int64_t rows = 0;
  while (std::getline(in, line)) ++rows;
  int64_t samples = 0;
  for (const auto& p : phases) samples += p.samples;
  EXPECT_EQ(rows, samples);
}

}  // namespace
}  // namespace amplab
