// run.trace: fit() writes a profiler trace of its window of steps, with each step and the
// MemoryTracker's phases as named ranges, that Perfetto and chrome://tracing open.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "amplab/report/run_dir.hpp"
#include "amplab/train/loop.hpp"
#include "amplab/train/trainer.hpp"
#include "mechanisms.hpp"

namespace amplab {
namespace {

namespace fs = std::filesystem;

TEST(Trace, FitWritesATraceOfFiveStepsWithTheirPhases) {
  torch::manual_seed(0);
  fs::path out = fs::temp_directory_path() / "amplab_trace_test";
  fs::remove_all(out);
  RunConfig run_config;
  run_config.out_dir = out.string();
  RunDir run = RunDir::create(run_config, "toy", "run: {}\n");

  auto net = std::make_shared<torch::nn::LinearImpl>(6, 3);
  LossFn loss = [net](const Batch& b) { return torch::nn::functional::cross_entropy(net->forward(b.input), b.target); };
  TrainConfig config;
  config.batch_size = 4;
  config.progress = false;
  MemoryConfig memory;
  memory.track = true;
  Trainer trainer(net, loss, config, torch::kCPU, course_mechanisms(), memory);
  torch::Tensor x = torch::randn({160, 6}), y = torch::randint(0, 3, {160}, torch::kInt64);
  TensorBatches batches(x, y, EpochSampler(160, 4, 0, true, false), torch::kCPU);  // 40 steps
  FitOptions options;
  options.lab = "toy";
  options.tag = "cpu";
  options.run_dir = &run;
  options.trace = true;
  ASSERT_EQ(fit(trainer, batches, options).status, FitStatus::completed);

  const fs::path trace = fs::path(run.path()) / "trace-cpu.json";
  ASSERT_TRUE(fs::exists(trace));
  std::ifstream in(trace);
  nlohmann::json json = nlohmann::json::parse(in);
  std::multiset<std::string> names;
  for (const auto& event : json.at("traceEvents"))
    if (event.contains("name") && event["name"].is_string()) names.insert(event["name"].get<std::string>());
  EXPECT_EQ(names.count("amplab_step"), 5u);
  EXPECT_GE(names.count("forward"), 5u);
  EXPECT_GE(names.count("backward"), 5u);
  EXPECT_GE(names.count("optimizer"), 5u);
  EXPECT_GT(names.count("aten::addmm"), 0u);  // PyTorch's own ops are in it too
  fs::remove_all(out);
}

TEST(Trace, NoTraceUnlessAsked) {
  fs::path out = fs::temp_directory_path() / "amplab_trace_test_off";
  fs::remove_all(out);
  RunConfig run_config;
  run_config.out_dir = out.string();
  RunDir run = RunDir::create(run_config, "toy", "run: {}\n");
  auto net = std::make_shared<torch::nn::LinearImpl>(6, 3);
  LossFn loss = [net](const Batch& b) { return torch::nn::functional::cross_entropy(net->forward(b.input), b.target); };
  TrainConfig config;
  config.batch_size = 4;
  config.progress = false;
  Trainer trainer(net, loss, config, torch::kCPU, course_mechanisms());
  TensorBatches batches(torch::randn({40, 6}), torch::randint(0, 3, {40}, torch::kInt64), EpochSampler(40, 4, 0, true, false),
                        torch::kCPU);
  FitOptions options;
  options.lab = "toy";
  options.tag = "cpu";
  options.run_dir = &run;
  ASSERT_EQ(fit(trainer, batches, options).status, FitStatus::completed);
  EXPECT_FALSE(fs::exists(fs::path(run.path()) / "trace-cpu.json"));
  fs::remove_all(out);
}

}  // namespace
}  // namespace amplab
