// run.trace: fit() writes a profiler trace of its window of steps, with each step and the
// MemoryTracker's phases as named ranges; a lab on lab_main writes one per phase it marks, cut
// short at a safe point after run.trace_seconds. Both are Chrome trace JSON that Perfetto and
// chrome://tracing open.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "amplab/lab_main.hpp"
#include "amplab/measure/timing.hpp"
#include "amplab/report/run_dir.hpp"
#include "amplab/train/loop.hpp"
#include "amplab/train/trainer.hpp"

namespace amplab {
namespace {

namespace fs = std::filesystem;

// A fresh run directory of a toy lab, removed afterwards.
class TraceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    out_ = fs::temp_directory_path() / ("amplab_trace_test_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(out_);
    run_config_.out_dir = out_.string();
    run_ = RunDir::create(run_config_, "toy", "run: {}\n");
  }
  void TearDown() override { fs::remove_all(out_); }

  fs::path file(const std::string& name) const { return fs::path(run_.path()) / name; }

  // A linear model on the CPU with a trainer over `samples` random samples, 4 a batch.
  FitStatus fit_toy(int64_t samples, bool trace, bool track_memory) {
    auto net = std::make_shared<torch::nn::LinearImpl>(6, 3);
    LossFn loss = [net](const Batch& b) { return torch::nn::functional::cross_entropy(net->forward(b.input), b.target); };
    TrainConfig config;
    config.batch_size = 4;
    config.progress = false;
    config.trace_steps = trace;
    MemoryConfig memory;
    memory.track = track_memory;
    Trainer trainer(net, loss, config, torch::kCPU, memory);
    TensorBatches batches(torch::randn({samples, 6}), torch::randint(0, 3, {samples}, torch::kInt64),
                          EpochSampler(samples, 4, 0, true, false), torch::kCPU);
    FitOptions options;
    options.lab = "toy";
    options.tag = "cpu";
    options.run_dir = &run_;
    return fit(trainer, batches, options).status;
  }

  fs::path out_;
  RunConfig run_config_;
  RunDir run_ = RunDir::none();
};

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

std::multiset<std::string> event_names(const nlohmann::json& trace) {
  std::multiset<std::string> names;
  for (const auto& event : trace.at("traceEvents"))
    if (event.contains("name") && event["name"].is_string()) names.insert(event["name"].get<std::string>());
  return names;
}

TEST_F(TraceTest, FitWritesATraceOfFiveStepsWithTheirPhases) {
  torch::manual_seed(0);
  ASSERT_EQ(fit_toy(160, /*trace=*/true, /*track_memory=*/true), FitStatus::completed);  // 40 steps
  ASSERT_TRUE(fs::exists(file("trace-cpu.json")));
  std::multiset<std::string> names = event_names(read_json(file("trace-cpu.json")));
  EXPECT_EQ(names.count("amplab_step"), 5u);
  EXPECT_GE(names.count("forward"), 5u);
  EXPECT_GE(names.count("backward"), 5u);
  EXPECT_GE(names.count("optimizer"), 5u);
  EXPECT_GT(names.count("aten::addmm"), 0u);  // PyTorch's own ops are in it too
}

TEST_F(TraceTest, NoTraceUnlessAsked) {
  ASSERT_EQ(fit_toy(40, /*trace=*/false, /*track_memory=*/false), FitStatus::completed);
  EXPECT_FALSE(fs::exists(file("trace-cpu.json")));
}

struct ToyConfig {
  RunConfig run;
  template <class V>
  void fields(V& v) {
    v.section("run", run);
  }
};

// What lab_main makes before a lab's body runs, with the phase trace it starts.
struct ToyLab {
  Lab<ToyConfig> lab;
  ToyLab(const RunConfig& run_config, const RunDir& run)
      : lab("toy", ToyConfig{run_config}, CommandLine{}, ConfigSource::parse("run: {}\n", "toy.yaml"), torch::kCPU, run,
            dist::WorldInfo{}, "") {
    lab.phase_trace = detail::start_phase_trace(run_config, run, torch::kCPU);
  }
};

// The extent [ts, ts + dur] of the first complete event named `name`.
std::pair<double, double> extent_of(const nlohmann::json& trace, const std::string& name) {
  for (const auto& event : trace.at("traceEvents"))
    if (event.value("name", "") == name && event.value("ph", "") == "X")
      return {event.at("ts").get<double>(), event.at("ts").get<double>() + event.at("dur").get<double>()};
  ADD_FAILURE() << "no complete event named " << name;
  return {0, 0};
}

TEST_F(TraceTest, EachPhaseOfALabIsTracedIntoItsOwnFile) {
  run_config_.trace = true;
  ToyLab toy(run_config_, run_);
  toy.lab.phase("matmul 64x64");
  torch::Tensor a = torch::randn({64, 64});
  torch::Tensor c = torch::mm(a, a);
  toy.lab.phase("copy");
  torch::Tensor d = c.clone();
  toy.lab.phase("matmul 64x64");  // marked again: a file of its own
  c = torch::mm(d, a);
  toy.lab.phase_trace->finish();

  for (const char* name : {"trace-matmul_64x64.json", "trace-copy.json", "trace-matmul_64x64-2.json"})
    EXPECT_TRUE(fs::exists(file(name))) << name;
  const nlohmann::json trace = read_json(file("trace-matmul_64x64.json"));
  std::multiset<std::string> names = event_names(trace);
  EXPECT_EQ(names.count("matmul 64x64"), 1u);
  EXPECT_EQ(names.count("aten::clone"), 0u);  // the next phase's op is in the next file
  ASSERT_GT(names.count("aten::mm"), 0u);
  auto [phase_start, phase_end] = extent_of(trace, "matmul 64x64");
  auto [mm_start, mm_end] = extent_of(trace, "aten::mm");
  EXPECT_LE(phase_start, mm_start);  // the op is inside the phase's range
  EXPECT_GE(phase_end, mm_end);
  EXPECT_GT(event_names(read_json(file("trace-copy.json"))).count("aten::clone"), 0u);
  EXPECT_EQ(toy.lab.phase_trace->written().size(), 3u);
}

TEST_F(TraceTest, PhasesAreTracedAsTheFilterAndTheBudgetAllow) {
  run_config_.trace = true;
  run_config_.trace_phases = {"matmul"};
  run_config_.trace_budget_mb = 1;
  ToyLab toy(run_config_, run_);
  toy.lab.phase("copy");  // not a matmul phase
  torch::Tensor a = torch::randn({16, 16}).clone();
  toy.lab.phase("matmul big");
  for (int i = 0; i < 2000; ++i) a = torch::mm(a, a).tanh();  // over 1 MiB of events
  toy.lab.phase("matmul small");  // over the budget: not traced
  a = torch::mm(a, a);
  toy.lab.phase("");
  EXPECT_FALSE(fs::exists(file("trace-copy.json")));
  ASSERT_TRUE(fs::exists(file("trace-matmul_big.json")));
  EXPECT_GT(fs::file_size(file("trace-matmul_big.json")), 1u << 20);
  EXPECT_FALSE(fs::exists(file("trace-matmul_small.json")));
}

TEST_F(TraceTest, ALongPhaseIsTracedUntilTheFirstTimedWindowAfterItsSeconds) {
  run_config_.trace = true;
  run_config_.trace_seconds = 0.05;
  ToyLab toy(run_config_, run_);
  toy.lab.phase("long");
  const torch::Tensor a = torch::randn({8, 8});
  int windows = 0;
  for (; windows < 1000 && toy.lab.phase_trace->written().empty(); ++windows) {
    DeviceTimer timer(torch::kCPU);
    timer.start();  // a safe point: the trace ends here once it has run 0.05 s
    torch::mm(a, a);
    timer.stop_ms();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(toy.lab.phase_trace->written().size(), 1u);
  torch::Tensor after = torch::mm(a, a).tanh();  // the phase goes on, untraced
  toy.lab.phase("");
  std::multiset<std::string> names = event_names(read_json(file("trace-long.json")));
  EXPECT_EQ(names.count("long"), 1u);
  EXPECT_EQ(names.count("aten::mm"), static_cast<size_t>(windows - 1));  // the last window started after the cut
  EXPECT_EQ(names.count("aten::tanh"), 0u);
  EXPECT_EQ(toy.lab.phase_trace->written().size(), 1u);  // the phase's end writes no second file
}

TEST_F(TraceTest, NoPhaseIsTracedWhenTraceIsOff) {
  run_config_.trace = false;
  ToyLab toy(run_config_, run_);
  EXPECT_EQ(toy.lab.phase_trace, nullptr);
  toy.lab.phase("matmul");
  torch::mm(torch::randn({8, 8}), torch::randn({8, 8}));
  toy.lab.phase("");
  for (const auto& entry : fs::directory_iterator(run_.path()))
    EXPECT_EQ(entry.path().filename().string().rfind("trace", 0), std::string::npos) << entry.path();
}

// run.trace and train.trace_steps together: one profiler at a time, so the steps are in the phase's trace.
TEST_F(TraceTest, AStepWindowInsideATracedPhaseIsInThePhasesTrace) {
  run_config_.trace = true;
  run_config_.trace_seconds = 3600;  // the whole phase
  ToyLab toy(run_config_, run_);
  toy.lab.phase("train");
  ASSERT_EQ(fit_toy(160, /*trace=*/true, /*track_memory=*/false), FitStatus::completed);
  toy.lab.phase("");
  toy.lab.phase_trace->finish();
  EXPECT_FALSE(fs::exists(file("trace-cpu.json")));
  ASSERT_TRUE(fs::exists(file("trace-train.json")));
  EXPECT_GT(event_names(read_json(file("trace-train.json"))).count("aten::addmm"), 0u);
}

}  // namespace
}  // namespace amplab
