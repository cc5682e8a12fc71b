// report.md: the README's questions with the run's own artifacts under each.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "amplab/report/report.hpp"

namespace {

namespace fs = std::filesystem;

const char* kReadme = R"(# Lab
Some theory.

## Questions
Answer from your run.

1. **Where does the GPU overtake the CPU?**
   Look at the crossover.
   <!-- report: matmul.csv, matmul.png, summary:results.crossover_n -->
2. **How large is the error of a host clock?** Before you run, predict it.
   <!-- report: timing.txt, gpu_only.png, summary:results.missing -->

## After
3. not a question of the section
)";

fs::path make_run(const std::string& name) {
  fs::path run = fs::temp_directory_path() / ("amplab_report_test_" + name);
  fs::remove_all(run);
  fs::create_directories(run);
  std::ofstream(run / "matmul.csv") << "n,cpu_ms,gpu_ms\n256,0.5,0.02\n\"1,024\",4.1,0.03\n";
  std::ofstream(run / "matmul.png") << "png";
  std::ofstream(run / "timing.txt") << "host 0.01 ms, events 5.2 ms";
  std::ofstream(run / "summary.json") << R"({"results": {"crossover_n": 512}, "environment": {"gpu": "NVIDIA H200", "cpu": "Xeon"}})";
  return run;
}

TEST(Report, EachQuestionGetsItsArtifacts) {
  const fs::path run = make_run("artifacts");
  const std::string text = amplab::report_text(kReadme, "gpu_basics", run.string());
  EXPECT_NE(text.find("# gpu_basics: report of run amplab_report_test_artifacts"), std::string::npos) << text;
  EXPECT_NE(text.find("Machine: NVIDIA H200; CPU Xeon"), std::string::npos) << text;
  EXPECT_NE(text.find("## 1. **Where does the GPU overtake the CPU?**\nLook at the crossover."), std::string::npos) << text;
  EXPECT_NE(text.find("| n | cpu_ms | gpu_ms |\n| --- | --- | --- |\n| 256 | 0.5 | 0.02 |\n| 1,024 | 4.1 | 0.03 |"),
            std::string::npos)
      << "a CSV becomes a table, quoted fields kept whole\n" << text;
  EXPECT_NE(text.find("![matmul.png](matmul.png)"), std::string::npos) << text;
  EXPECT_NE(text.find("- `results.crossover_n`: 512"), std::string::npos) << text;
  EXPECT_NE(text.find("```\nhost 0.01 ms, events 5.2 ms\n```"), std::string::npos) << text;
  EXPECT_NE(text.find("(gpu_only.png: not written by this run)"), std::string::npos) << text;
  EXPECT_NE(text.find("- `results.missing`: (not in this run's summary.json)"), std::string::npos) << text;
  EXPECT_EQ(text.find("not a question of the section"), std::string::npos) << "the section ends at the next heading";
  size_t answers = 0;
  for (size_t at = text.find("**Your answer:**"); at != std::string::npos; at = text.find("**Your answer:**", at + 1))
    ++answers;
  EXPECT_EQ(answers, 2u);
  // Only the question that asks for a prediction gets a place for it, before its measurements.
  const size_t prediction = text.find("**Your prediction (from before the run):**");
  ASSERT_NE(prediction, std::string::npos) << text;
  EXPECT_EQ(text.find("**Your prediction", prediction + 1), std::string::npos) << "question 1 asks for none\n" << text;
  EXPECT_GT(prediction, text.find("## 2. "));
  EXPECT_LT(prediction, text.find("`timing.txt`:")) << "the prediction comes before the measurement";
  fs::remove_all(run);
}

TEST(Report, NoQuestionsNoReport) {
  EXPECT_EQ(amplab::report_text("# Lab\n## Theory\n1. a list, not questions\n", "x", "/nonexistent"), "");
}

TEST(Report, LongTablesAreCut) {
  const fs::path run = make_run("long");
  {
    std::ofstream csv(run / "matmul.csv");
    csv << "i\n";
    for (int i = 0; i < 45; ++i) csv << i << "\n";
  }
  const std::string text = amplab::report_text(kReadme, "gpu_basics", run.string());
  EXPECT_NE(text.find("| 29 |"), std::string::npos);
  EXPECT_EQ(text.find("| 30 |"), std::string::npos);
  EXPECT_NE(text.find("(15 more rows in matmul.csv)"), std::string::npos) << text;
  fs::remove_all(run);
}

}  // namespace
