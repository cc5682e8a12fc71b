// Timing helpers: order statistics as numpy computes them, and the GPU monitor on a CPU device.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "amplab/measure/gpu_monitor.hpp"
#include "amplab/measure/gpu_timeline.hpp"
#include "amplab/measure/timing.hpp"
#include "support.hpp"

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

// The graded speed tests' turns: reference, yours, reference, yours; each side's fastest; a
// failed measure (0) ends the rounds before the other side runs again.
TEST(Timing, SpeedTestsKeepEachSidesFastestTurnAndStopAtAFailure) {
  std::vector<std::string> calls;
  const auto times = test::fastest_of_turns(
      [&](int round) { calls.push_back("reference " + std::to_string(round)); return round == 0 ? 12.0 : 10.0; },
      [&](int round) { calls.push_back("yours " + std::to_string(round)); return round == 0 ? 11.0 : 15.0; });
  EXPECT_EQ(calls, (std::vector<std::string>{"reference 0", "yours 0", "reference 1", "yours 1"}));
  EXPECT_DOUBLE_EQ(times.reference, 10.0);
  EXPECT_DOUBLE_EQ(times.mine, 11.0);

  calls.clear();
  const auto failed = test::fastest_of_turns(
      [&](int) { calls.push_back("reference"); return 0.0; }, [&](int) { calls.push_back("yours"); return 5.0; });
  EXPECT_EQ(calls, std::vector<std::string>{"reference"});
  EXPECT_EQ(failed.reference, 0);
  EXPECT_EQ(failed.mine, 0);
}

// The speed tests read the run's own summary.json, never one written deeper in its directory
// (a checkpoint directory the lab's code writes into).
TEST(Timing, SpeedTestsReadOnlyTheRunsOwnSummary) {
  test::TempDir dir;
  dir.write("runs/ddp/20260101-000000/zero3-checkpoint/summary.json", R"({"forged": true})");
  EXPECT_NONFATAL_FAILURE(EXPECT_TRUE(test::lab_run_summary(dir.file("runs")).is_null()), "no <lab>/<stamp>/summary.json");
  dir.write("runs/ddp/20260101-000000/summary.json", R"({"bench": []})");
  EXPECT_TRUE(test::lab_run_summary(dir.file("runs")).contains("bench"));
}

// The calls a speed test makes when scripts/grade times it from outside (AMPLAB_SPEED_CALLS).
struct SpeedCallCount {
  int prepares = 0, calls = 0;
  torch::Tensor x = torch::ones({1000});
  test::SpeedCalls speed(int n) {
    return {n, [this](int) { ++prepares; x.uniform_(); }, [this] {
              ++calls;
              return std::vector<torch::Tensor>{x * 2, x.sum()};
            }};
  }
};

TEST(Timing, SpeedTestsMakeTheGradersCallsOnlyWhenAsked) {
  SpeedCallCount none;
  unsetenv("AMPLAB_SPEED_CALLS");
  EXPECT_FALSE(test::make_speed_calls_for_the_grader(none.speed(5)));  // a plain run times the code itself
  EXPECT_EQ(none.calls, 0);

  SpeedCallCount calls;
  setenv("AMPLAB_SPEED_CALLS", "calls", 1);
  EXPECT_TRUE(test::make_speed_calls_for_the_grader(calls.speed(5)));
  EXPECT_EQ(calls.calls, 6);  // the warm-up and five, each on fresh inputs
  EXPECT_EQ(calls.prepares, 6);

  SpeedCallCount prepare;  // the grader's run of everything but the calls
  setenv("AMPLAB_SPEED_CALLS", "prepare", 1);
  EXPECT_TRUE(test::make_speed_calls_for_the_grader(prepare.speed(5)));
  EXPECT_EQ(prepare.calls, 1);
  EXPECT_EQ(prepare.prepares, 6);

  setenv("AMPLAB_SPEED_CALLS", "fast", 1);
  SpeedCallCount bad;
  EXPECT_NONFATAL_FAILURE(test::make_speed_calls_for_the_grader(bad.speed(5)), "AMPLAB_SPEED_CALLS=fast");
  unsetenv("AMPLAB_SPEED_CALLS");
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
