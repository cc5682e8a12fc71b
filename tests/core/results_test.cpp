// The results sink: one row recorded once shows on the console, in <table>.csv and in summary.json.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "amplab/report/results.hpp"
#include "amplab/report/run_dir.hpp"

namespace amplab {
namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

ResultTable example() {
  ResultTable t("precision", {{"precision", "precision", decimals(0)},
                              {"step_ms", "ms/step", decimals(2)},
                              {"step_ms_iqr", "", decimals(2)},
                              {"speedup", "speed-up", times(2)},
                              {"peak_fraction", "% of peak", percent_of_one(1)}});
  t.add({"fp32", 12.3456, 0.25, 1.0, 0.4321});
  t.add({"fp16-mixed", nullptr, nullptr, nullptr, nullptr});
  return t;
}

TEST(Results, TheConsoleShowsFormattedValuesAndHidesUnlabelledColumns) {
  std::string text = example().console();
  EXPECT_NE(text.find("ms/step"), std::string::npos);
  EXPECT_NE(text.find("12.35"), std::string::npos);
  EXPECT_NE(text.find("1.00x"), std::string::npos);
  EXPECT_NE(text.find("43.2%"), std::string::npos);
  EXPECT_EQ(text.find("step_ms_iqr"), std::string::npos);
  EXPECT_EQ(text.find("0.25"), std::string::npos);
  EXPECT_NE(text.find("fp16-mixed  -"), std::string::npos) << text;
}

TEST(Results, CsvAndSummaryKeepEveryColumnInFullPrecision) {
  fs::path dir = fs::temp_directory_path() / "amplab_results_test";
  fs::remove_all(dir);
  RunConfig config;
  config.out_dir = dir.string();
  RunDir run = RunDir::create(config, "lab", "run: {}\n");
  Results results;
  auto& t = results.table("precision", {{"precision", "precision", decimals(0)}, {"step_ms", "ms/step", decimals(2)}});
  t.add({"fp32", 12.3456}).add({"bf16", std::nan("")});
  results.set("device", "cpu");
  results.write(run);
  EXPECT_EQ(read(fs::path(run.path()) / "precision.csv"), "precision,step_ms\nfp32,12.3456\nbf16,\n");
  auto summary = nlohmann::json::parse(read(fs::path(run.path()) / "summary.json"));
  EXPECT_EQ(summary["device"], "cpu");
  ASSERT_EQ(summary["precision"].size(), 2u);
  EXPECT_DOUBLE_EQ(summary["precision"][0]["step_ms"].get<double>(), 12.3456);
  EXPECT_TRUE(summary["precision"][1]["step_ms"].is_null());
  EXPECT_EQ(summary["lab"], "lab");
  fs::remove_all(dir);
}

TEST(Results, ARowOfTheWrongWidthIsAProgrammingError) {
  ResultTable t("x", {{"a", "a"}, {"b", "b"}});
  EXPECT_THROW(t.add({1}), std::logic_error);
}

}  // namespace
}  // namespace amplab

// lab_main's guard: running out of memory names the keys that set the lab's sizes.
#include <c10/util/Exception.h>

#include "amplab/lab_main.hpp"

#include <signal.h>

namespace amplab {
namespace {

std::string error_of(const std::function<int()>& body) {
  try {
    run_lab_body(body, "amp.mlp.width, amp.mlp.batch");
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(LabMain, RunningOutOfMemoryNamesTheSizeKeys) {
  std::string cpu = error_of([]() -> int {
    throw c10::Error("DefaultCPUAllocator: can't allocate memory: you tried to allocate 68719476736 bytes.\nmore");
  });
  EXPECT_NE(cpu.find("out of CPU memory"), std::string::npos) << cpu;
  EXPECT_NE(cpu.find("68719476736 bytes"), std::string::npos) << cpu;
  EXPECT_NE(cpu.find("lower amp.mlp.width, amp.mlp.batch"), std::string::npos) << cpu;
  EXPECT_EQ(cpu.find("more"), std::string::npos) << cpu;
  std::string gpu = error_of([]() -> int { throw c10::OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"); });
  EXPECT_NE(gpu.find("out of GPU memory: CUDA out of memory. Tried to allocate 2.00 GiB; lower amp.mlp.width"), std::string::npos) << gpu;
  std::string other = error_of([]() -> int { throw c10::Error("Expected all tensors to be on the same device"); });
  EXPECT_EQ(other.rfind("Expected all tensors to be on the same device", 0), 0u) << other;
  EXPECT_EQ(other.find("lower"), std::string::npos) << other;
  EXPECT_EQ(run_lab_body([] { return 7; }, "").exit_code, 7);
}

// A Ctrl-C in the middle of a study's rows: the rows finished are recorded, the body ends at the
// next safe point with 130, and the signal is named.
TEST(LabMain, AStopSignalKeepsTheRowsFinishedAndEndsTheBodyWith130) {
  std::optional<InterruptHandler> handler(std::in_place);
  std::vector<int> rows, recorded;
  const BodyEnd end = run_lab_body(
      [&] {
        run_then_record(
            [&] {
              for (int row = 0; row < 5; ++row) {
                stop_if_interrupted();
                rows.push_back(row);
                if (row == 1) ::raise(SIGINT);  // Ctrl-C while the second row runs
              }
            },
            [&] { recorded = rows; });
        return kExitOk;
      },
      "");
  handler.reset();
  handler.emplace();  // a new handler starts with no signal: the tests after this one run on
  EXPECT_EQ(end.exit_code, 130);
  EXPECT_EQ(end.interrupted_by, SIGINT);
  EXPECT_EQ(recorded, (std::vector<int>{0, 1}));
  EXPECT_FALSE(interrupt_requested());
}

}  // namespace
}  // namespace amplab
