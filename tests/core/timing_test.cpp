// Timing helpers: order statistics as numpy computes them, and the GPU monitor on a CPU device.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "amplab/measure/gpu_monitor.hpp"
#include "amplab/measure/gpu_timeline.hpp"
#include "amplab/measure/timing.hpp"

namespace amplab {
namespace {

TEST(Timing, SummaryQuantilesInterpolateAsNumpyDoes) {
  // numpy.percentile([4, 1, 3, 2, 10], [25, 50, 75]) = [2, 3, 4]; of [1, 2, 3, 4]: [1.75, 2.5, 3.25]
  Summary odd = summarize({4, 1, 3, 2, 10});
  EXPECT_DOUBLE_EQ(odd.q1, 2);
  EXPECT_DOUBLE_EQ(odd.median, 3);
  EXPECT_DOUBLE_EQ(odd.q3, 4);
  EXPECT_DOUBLE_EQ(odd.iqr, 2);
  EXPECT_DOUBLE_EQ(odd.mean, 4);
  Summary even = summarize({1, 2, 3, 4});
  EXPECT_DOUBLE_EQ(even.q1, 1.75);
  EXPECT_DOUBLE_EQ(even.median, 2.5);
  EXPECT_DOUBLE_EQ(even.q3, 3.25);
}

TEST(GpuMonitor, OnACpuDeviceItIsUnavailableAndReadsNothing) {
  GpuMonitor monitor(torch::Device(torch::kCPU));
  EXPECT_FALSE(monitor.available());
  monitor.start();
  EXPECT_FALSE(monitor.stop().has_value());
}

TEST(GpuTimeline, OnACpuDeviceItSamplesNothingAndWritesNoFile) {
  const auto csv = std::filesystem::temp_directory_path() / "amplab_gpu_timeline_cpu.csv";
  std::filesystem::remove(csv);
  GpuTimeline timeline(torch::Device(torch::kCPU), csv.string());
  EXPECT_FALSE(timeline.available());
  timeline.phase("train");
  timeline.stop();
  EXPECT_TRUE(timeline.phases().empty());
  EXPECT_TRUE(timeline.summary().empty());
  EXPECT_FALSE(std::filesystem::exists(csv));
}

}  // namespace
}  // namespace amplab
