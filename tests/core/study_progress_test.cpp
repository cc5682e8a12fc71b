// A study's rows kept across an interruption (state/study_progress.hpp), and the config
// comparison it and the distributed ranks use (infra/config_json.hpp).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "amplab/infra/config_json.hpp"
#include "amplab/infra/error.hpp"
#include "amplab/infra/files.hpp"
#include "amplab/state/study_progress.hpp"
#include "support.hpp"

namespace amplab {
namespace {

const std::string kYaml = "run:\n  out_dir: runs\n  seed: 0\nstudy:\n  steps: 300\n  rows: [fp32, bf16]\n";

RunConfig run_config(const test::TempDir& dir) {
  RunConfig config;
  config.out_dir = dir.file("runs");
  return config;
}

TEST(ConfigDifference, NamesTheFirstKeyThatDiffersWithBothValues) {
  const std::string longer = "run:\n  out_dir: runs\n  seed: 0\nstudy:\n  steps: 500\n  rows: [fp32, bf16]\n";
  const auto d = first_config_difference(kYaml, longer);
  EXPECT_EQ(d.key, "study.steps");
  EXPECT_EQ(d.before, "300");
  EXPECT_EQ(d.now, "500");
  EXPECT_TRUE(first_config_difference(kYaml, kYaml).key.empty());
}

TEST(ConfigDifference, SkipsFreeKeysAndSeesAKeyOnlyOneSideHas) {
  const std::string other_dir = "run:\n  out_dir: elsewhere\n  seed: 0\nstudy:\n  steps: 300\n  rows: [fp32, bf16]\n";
  EXPECT_EQ(first_config_difference(kYaml, other_dir).key, "run.out_dir");
  EXPECT_TRUE(first_config_difference(kYaml, other_dir, {"run.out_dir"}).key.empty());
  const auto missing = first_config_difference(kYaml, "run:\n  out_dir: runs\n  seed: 0\nstudy:\n  steps: 300\n");
  EXPECT_EQ(missing.key, "study.rows");
  EXPECT_EQ(missing.now, "(not set)");
}

TEST(StudyProgress, ARowRecordedIsKeptByTheRunThatResumesIt) {
  test::TempDir dir;
  const RunConfig config = run_config(dir);
  std::string first_path;
  {
    RunDir first = RunDir::create(config, "study_lab", kYaml);
    first_path = first.path();
    StudyProgress progress(first, config, kYaml, "", false, {});
    EXPECT_FALSE(progress.done("fp32"));
    progress.record("fp32", {{"val_loss", 2.5}, {"curve", {{10, 3.0, 3.1}}}});
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a later modification time
  RunDir second = RunDir::create(config, "study_lab", kYaml);
  StudyProgress resumed(second, config, kYaml, "latest", false, {});
  EXPECT_EQ(resumed.resumed_from(), first_path);
  ASSERT_TRUE(resumed.done("fp32"));
  EXPECT_DOUBLE_EQ(resumed.done("fp32")->at("val_loss").get<double>(), 2.5);
  EXPECT_FALSE(resumed.done("bf16"));
  // The resumed run's own progress.json holds the kept row: a second interruption keeps it too.
  RunDir third = RunDir::create(config, "study_lab", kYaml);
  StudyProgress again(third, config, kYaml, second.path(), false, {});
  EXPECT_TRUE(again.done("fp32"));
}

TEST(StudyProgress, AnotherConfigIsRefusedNamingTheKeyUnlessForced) {
  test::TempDir dir;
  const RunConfig config = run_config(dir);
  RunDir first = RunDir::create(config, "study_lab", kYaml);
  StudyProgress(first, config, kYaml, "", false, {}).record("fp32", {{"val_loss", 2.5}});
  const std::string changed = "run:\n  out_dir: runs\n  seed: 1\nstudy:\n  steps: 300\n  rows: [fp32, bf16]\n";
  RunDir second = RunDir::create(config, "study_lab", changed);
  EXPECT_TRUE(test::throws_with([&] { StudyProgress(second, config, changed, first.path(), false, {}); },
                                {"run.seed", "was 0, now 1", "--force", first.path()}));
  EXPECT_TRUE(StudyProgress(second, config, changed, first.path(), /*force=*/true, {}).done("fp32"));
  EXPECT_TRUE(StudyProgress(second, config, changed, first.path(), false, {"run.seed"}).done("fp32"));
}

TEST(StudyProgress, NothingToResumeFromIsOneClearError) {
  test::TempDir dir;
  const RunConfig config = run_config(dir);
  RunDir run = RunDir::create(config, "study_lab", kYaml);
  EXPECT_TRUE(test::throws_with([&] { StudyProgress(run, config, kYaml, "latest", false, {}); },
                                {"--resume latest", "no interrupted run of study_lab"}));
  EXPECT_TRUE(test::throws_with([&] { StudyProgress(run, config, kYaml, dir.file("nowhere"), false, {}); },
                                {"--resume", "nowhere", "progress.json"}));
  const std::string damaged = dir.write("damaged/progress.json", "{\"lab\": \"study_lab\"");
  EXPECT_TRUE(test::throws_with([&] { StudyProgress(run, config, kYaml, damaged, false, {}); },
                                {damaged, "not the progress"}));
}

}  // namespace
}  // namespace amplab
