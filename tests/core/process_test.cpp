// Whole-process behaviour of a lab binary (build/bin/mnist on a tiny made-up dataset, CPU):
// Ctrl-C/SIGTERM save a checkpoint and exit 130/143, the checkpoint loads and the resumed run
// finishes; a second signal exits at once; kill -9 during checkpoint writes never breaks the
// previous checkpoint; bad input ends in one line and exit code 2.
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <random>
#include <thread>

#include "amplab/state/checkpoint.hpp"
#include "amplab/data/idx.hpp"
#include "amplab/infra/files.hpp"
#include "idx_files.hpp"
#include "process.hpp"
#include "support.hpp"

namespace amplab {
namespace {

using test::encode_idx;

std::string lab_binary(const std::string& name) { return test::binary_dir() + "/bin/" + name; }

// 400 training and 100 test images of random noise with random labels: enough steps to interrupt.
void write_tiny_dataset(const test::TempDir& dir, const std::string& sub = "data") {
  std::mt19937 rng(5);
  for (auto [split, n] : {std::pair{"train", 400}, std::pair{"t10k", 100}}) {
    IdxArray images, labels;
    images.dims = {n, 28, 28};
    labels.dims = {n};
    for (int64_t i = 0; i < n * 28 * 28; ++i) images.data.push_back(static_cast<uint8_t>(rng() % 256));
    for (int64_t i = 0; i < n; ++i) labels.data.push_back(static_cast<uint8_t>(rng() % 10));
    dir.write(sub + "/" + split + "-images-idx3-ubyte.gz", encode_idx(images, true));
    dir.write(sub + "/" + split + "-labels-idx1-ubyte.gz", encode_idx(labels, true));
  }
}

std::vector<std::string> mnist_args(const test::TempDir& dir, int epochs) {
  return {lab_binary("mnist"),
          "--set", "data.dir=" + dir.file("data"),
          "--set", "run.out_dir=" + dir.file("runs"),
          "--set", "mnist.modes=[cpu]",
          "--set", "train.epochs=" + std::to_string(epochs),
          "--set", "mnist.plots=false",
          "--set", "train.batch_size=8",
          "--set", "train.log_every=1",
          "--set", "train.progress=false",
          "--set", "run.deterministic=true"};
}

class Interrupt : public ::testing::TestWithParam<int> {};

// Two trials at random moments once training runs: SIGTERM (trial 1) and SIGINT (trial 2). That a
// resumed run ends where the uninterrupted one does, to the bit, is proved in-process for every
// step (tests/core/trainer_test.cpp) and by the fault sweep's stop cases; these trials prove the
// binary's side: the signal caught, the checkpoint written whole, the resume it names.
TEST_P(Interrupt, SavesACheckpointThatResumesToTheEnd) {
  test::TempDir dir;
  write_tiny_dataset(dir);
  std::mt19937 rng(static_cast<unsigned>(GetParam()) * 7919u);
  const int sig = GetParam() % 2 ? SIGTERM : SIGINT;

  test::Child child(mnist_args(dir, 50));
  ASSERT_TRUE(child.wait_for_output("[cpu] epoch 1/50", 60)) << child.output();
  std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 400));
  child.signal(sig);
  int code = child.wait(60);
  const std::string& out = child.output();
  EXPECT_EQ(code, 128 + sig) << out;
  auto at = out.find("interrupted at epoch ");
  ASSERT_NE(at, std::string::npos) << out;
  auto saved = out.find("checkpoint saved to ", at);
  ASSERT_NE(saved, std::string::npos) << out;
  EXPECT_NE(out.find("resume with --resume ", saved), std::string::npos) << out;
  std::string path = out.substr(saved + 20, out.find(';', saved) - saved - 20);
  auto info = read_checkpoint_info(path);  // loads: header, checksum and contents are whole
  EXPECT_EQ(info.lab, "mnist");
  EXPECT_EQ(info.tag, "cpu");
  EXPECT_GT(info.position.global_step, 0);

  auto args = mnist_args(dir, 50);
  args.push_back("--set");
  args.push_back("train.epochs=2");  // finish quickly: the checkpoint is in epoch 1 or 2
  args.push_back("--resume");
  args.push_back(path);
  args.push_back("--force");  // fewer epochs change the linear schedule's rates: the run must be told
  if (info.position.epoch >= 2) GTEST_SKIP() << "interrupted after epoch 2; nothing left to resume with 2 epochs";
  std::string resumed;
  EXPECT_EQ(test::run(args, &resumed, 120), 0) << resumed;
  EXPECT_NE(resumed.find("resumed from " + path), std::string::npos) << resumed;
  EXPECT_NE(resumed.find("results: "), std::string::npos) << resumed;
}

INSTANTIATE_TEST_SUITE_P(Trials, Interrupt, ::testing::Values(1, 2));

TEST(Interrupt, SecondSignalExitsAtOnce) {
  test::TempDir dir;
  write_tiny_dataset(dir);
  test::Child child(mnist_args(dir, 50));
  ASSERT_TRUE(child.wait_for_output("[cpu] epoch 1/50", 60)) << child.output();
  child.signal(SIGINT);
  child.signal(SIGINT);
  int code = child.wait(30);
  // Either the second signal arrived while the first was being handled (exit 130 at once, no
  // checkpoint message), or after the save completed (still 130). Never a hang, never a crash.
  EXPECT_EQ(code, 130) << child.output();
  // No temporary checkpoint file is left behind.
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

// Every lab stops the same way: a study lab (no training loop, no checkpoint) stopped in its
// matmul sweep keeps the rows it finished, marks summary.json and report.md partial, says where it
// stopped and how to go on, and exits 130.
TEST(Interrupt, AStudyLabKeepsItsFinishedRowsAndSaysWhereItStopped) {
  test::TempDir dir;
  test::Child child({lab_binary("gpu_basics"), "--set", "run.out_dir=" + dir.file("runs"), "--set", "bench.copy_mib=1",
                     "--set", "bench.matmul_sizes=[64, 128, 2048, 2048, 2048, 2048, 2048, 2048]", "--set",
                     "bench.cpu_max_size=4096"});
  ASSERT_TRUE(child.wait_for_output("== Memory bandwidth", 120)) << child.output();
  child.signal(SIGINT);
  EXPECT_EQ(child.wait(120), 130) << child.output();
  // In the sweep, or at its start when the signal came as the section before it ended.
  const std::string where = child.output().find("before 'matmul'") != std::string::npos ? "before 'matmul'" : "in 'matmul'";
  EXPECT_NE(child.output().find("stopped by Ctrl-C (SIGINT) " + where), std::string::npos) << child.output();
  EXPECT_NE(child.output().find("run the lab again"), std::string::npos) << child.output();
  const auto runs = std::filesystem::directory_iterator(dir.file("runs/gpu_basics"));
  const std::filesystem::path run = runs->path();
  const auto summary = nlohmann::json::parse(read_file((run / "summary.json").string()));
  EXPECT_EQ(summary.at("status"), "interrupted");
  EXPECT_EQ(summary.at("interrupted").at("where"), where);
  EXPECT_EQ(summary.at("bandwidth").size(), 1u);  // the section finished before the signal, whole
  EXPECT_LT(summary.value("matmul", nlohmann::json::array()).size(), 4u);  // stopped at a size, not at its end
  EXPECT_NE(read_file((run / "report.md").string()).find("**A partial run:** stopped by Ctrl-C (SIGINT) " + where),
            std::string::npos);
}

// kill -9 at random moments while checkpoints are being written, 50 times: `latest` always names
// a checkpoint that loads (the write is atomic: temp file, fsync, rename).
TEST(KillDuringSave, PreviousCheckpointAlwaysLoads) {
  test::TempDir dir;
  write_tiny_dataset(dir);
  auto args = mnist_args(dir, 1000);
  args.insert(args.end(), {"--set", "checkpoint.every_steps=1", "--set", "checkpoint.keep_last=2",
                           "--set", "checkpoint.dir=" + dir.file("ckpt")});
  std::mt19937 rng(99);
  CheckpointManager manager(dir.file("ckpt"), 2);
  int kills = 0;
  for (int trial = 0; trial < 50; ++trial) {
    test::Child child(args);
    if (trial == 0) ASSERT_TRUE(child.wait_for_output("epoch 1/1000 2/", 60)) << child.output();
    else ASSERT_TRUE(child.wait_for_output("[cpu] epoch", 60)) << child.output();
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 30000));
    child.signal(SIGKILL);
    EXPECT_EQ(child.wait(30), 128 + SIGKILL);
    ++kills;
    std::string latest = manager.resolve("latest");
    EXPECT_NO_THROW(read_checkpoint_info(latest)) << "trial " << trial << ": " << latest;
  }
  std::cout << "[ kill -9  ] " << kills << " kills during checkpointing; latest loaded every time\n";
}

TEST(BadInput, OneLineErrorsAndExitCode2) {
  test::TempDir dir;
  std::string out;
  EXPECT_EQ(test::run({lab_binary("mnist"), "--config", dir.file("missing.yaml")}, &out), 2);
  EXPECT_NE(out.find("missing.yaml"), std::string::npos) << out;
  EXPECT_EQ(test::run({lab_binary("mnist"), "--set", "train.lr=0.1"}, &out), 2);
  EXPECT_NE(out.find("unknown key 'train.lr'; did you mean 'train.optimizer.lr'?"), std::string::npos) << out;
  EXPECT_EQ(test::run({lab_binary("mnist"), "--set", "data.dir=" + dir.path().string(), "--set",
                       "run.out_dir=" + dir.file("runs")}, &out), 2);
  EXPECT_NE(out.find("no fashion-mnist files"), std::string::npos) << out;
  std::string bad = dir.write("bad.ckpt", "garbage");
  EXPECT_EQ(test::run({lab_binary("mnist"), "--resume", bad, "--set", "run.out_dir=" + dir.file("resume_runs")}, &out), 2);
  EXPECT_NE(out.find("not an amplab checkpoint"), std::string::npos) << out;
  // That run had made its run directory: its log ends with the same error line.
  std::vector<std::filesystem::path> logs;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir.file("resume_runs")))
    if (entry.path().filename() == "mnist.log") logs.push_back(entry.path());
  ASSERT_EQ(logs.size(), 1u);
  std::string log_text = read_file(logs[0].string());
  EXPECT_NE(log_text.find("error] error: checkpoint '" + bad + "' is not an amplab checkpoint"), std::string::npos) << log_text;
  EXPECT_EQ(test::run({lab_binary("mnist"), "--bogus"}, &out), 2);
  EXPECT_NE(out.find("--bogus"), std::string::npos) << out;
  EXPECT_EQ(test::run({lab_binary("gpu_basics"), "--set", "bench.dtypes=[fp8]", "--set", "run.out_dir=" + dir.file("runs")}, &out), 2);
  EXPECT_NE(out.find("fp8"), std::string::npos) << out;
  for (const std::string& text : {out}) EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
  // Two keys each valid alone but not together: named with where each came from, before any run
  // directory is made.
  EXPECT_EQ(test::run({lab_binary("ddp"), "--set", "bench.width=256", "--set", "bench.first_layer_pieces=300", "--set",
                       "run.out_dir=" + dir.file("ddp_runs")}, &out), 2);
  EXPECT_NE(out.find("--set bench.first_layer_pieces=300: bench.first_layer_pieces: 300 pieces"), std::string::npos) << out;
  EXPECT_NE(out.find("(--set bench.width=256); allowed: 1 to bench.width"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_FALSE(std::filesystem::exists(dir.file("ddp_runs"))) << out;
  // A version of gradient synchronization the lab does not have: the key and the allowed values.
  EXPECT_EQ(test::run({lab_binary("ddp"), "--set", "dist.sync=ring", "--set", "run.out_dir=" + dir.file("ddp_runs")}, &out), 2);
  EXPECT_NE(out.find("--set dist.sync=ring: dist.sync: expected one of naive, flat, overlapped, bucketed; got 'ring'"),
            std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_FALSE(std::filesystem::exists(dir.file("ddp_runs"))) << out;
}

}  // namespace
}  // namespace amplab

namespace amplab {
namespace {

// ---- Resuming, and what a run refuses ------------------------------------------------------------

// Resuming a finished run says so and exits 0 with its results (it crashed here once); more
// epochs under the config's linear schedule change the rate curve, so they need --force.
TEST(Resume, AFinishedRunSaysSoAndTrainsMoreOnlyWhenForced) {
  test::TempDir dir;
  write_tiny_dataset(dir);
  std::string out;
  ASSERT_EQ(test::run(mnist_args(dir, 2), &out), 0) << out;
  auto again = mnist_args(dir, 2);
  again.insert(again.end(), {"--resume", "latest"});
  EXPECT_EQ(test::run(again, &out), 0) << out;
  EXPECT_NE(out.find("nothing left to train"), std::string::npos) << out;
  EXPECT_NE(out.find("results: "), std::string::npos) << out;
  auto more = mnist_args(dir, 3);
  more.insert(more.end(), {"--resume", "latest"});
  EXPECT_EQ(test::run(more, &out), 2) << out;
  EXPECT_NE(out.find("error: --resume: train.epochs is 3 now but was 2"), std::string::npos) << out;
  more.push_back("--force");
  EXPECT_EQ(test::run(more, &out), 0) << out;
  EXPECT_NE(out.find("[cpu] epoch 3: train loss"), std::string::npos) << out;
}

// --resume auto: a fresh start when there is no checkpoint, the latest when there is one.
TEST(Resume, AutoStartsFreshOrGoesOnFromTheLatest) {
  test::TempDir dir;
  write_tiny_dataset(dir);
  auto args = mnist_args(dir, 1);
  args.insert(args.end(), {"--resume", "auto"});
  std::string out;
  EXPECT_EQ(test::run(args, &out), 0) << out;
  EXPECT_NE(out.find("no checkpoint in"), std::string::npos) << out;
  EXPECT_EQ(test::run(args, &out), 0) << out;
  EXPECT_NE(out.find("resuming from the latest checkpoint"), std::string::npos) << out;
}

// Two runs in one checkpoint directory: the second is refused while the first writes there,
// and a later fresh run never deletes the checkpoint an interrupted run printed.
TEST(Resume, CheckpointsBelongToTheRunThatWroteThem) {
  test::TempDir dir;
  write_tiny_dataset(dir);
  test::Child first(mnist_args(dir, 50));
  ASSERT_TRUE(first.wait_for_output("[cpu] epoch 1/50", 60)) << first.output();
  std::string out;
  EXPECT_EQ(test::run(mnist_args(dir, 1), &out), 2) << out;
  EXPECT_NE(out.find("is in use by another run"), std::string::npos) << out;
  first.signal(SIGINT);
  ASSERT_EQ(first.wait(60), 130) << first.output();
  const std::string& text = first.output();
  auto saved = text.find("checkpoint saved to ");
  ASSERT_NE(saved, std::string::npos) << text;
  std::string printed = text.substr(saved + 20, text.find(';', saved) - saved - 20);
  auto fresh = mnist_args(dir, 2);
  fresh.insert(fresh.end(), {"--set", "checkpoint.every_steps=1", "--set", "checkpoint.keep_last=1"});
  ASSERT_EQ(test::run(fresh, &out), 0) << out;
  EXPECT_NO_THROW(read_checkpoint_info(printed)) << printed;
}

// The AMP lab's dtype census, as a student reads it in summary.json: every tensor of the small
// step in the dtype PyTorch's own autocast gives it (tests/fixtures/autocast_census_golden.json,
// made by make_autocast_census_golden.py on the CPU and on CUDA), on the device this machine has.
void expect_census_as_pytorchs(const std::string& device) {
  test::TempDir dir;
  std::string out;
  ASSERT_EQ(test::run({lab_binary("amp_training"), "--set", "run.device=" + device, "--set", "amp.models=[]", "--set",
                       "amp.underflow.enabled=false", "--set", "amp.overflow.enabled=false", "--set", "amp.plots=false",
                       "--set", "run.out_dir=" + dir.file("runs")},
                      &out),
            0)
      << out;
  const auto run = std::filesystem::directory_iterator(dir.file("runs/amp_training"))->path();
  const auto census = nlohmann::json::parse(read_file((run / "summary.json").string())).at("autocast_dtypes");
  const auto golden = test::load_fixture("autocast_census_golden.json").at(device);
  for (const auto& [column, precision] : {std::pair{"fp16_mixed", "fp16-mixed"}, {"bf16_mixed", "bf16-mixed"}}) {
    if (!golden.contains(precision)) {  // fp16-mixed does not run on the CPU: no dtypes, not wrong ones
      for (const auto& row : census) EXPECT_TRUE(row.at(column).is_null()) << row;
      continue;
    }
    const auto& expected = golden.at(precision);
    ASSERT_EQ(census.size(), expected.size()) << census;
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_EQ(census[i].at("tensor"), expected[i][0]);
      EXPECT_EQ(census[i].at(column), expected[i][1]) << precision << ", " << expected[i][0];
    }
  }
}

TEST(LabOutputs, TheAmpLabsDtypeCensusIsPyTorchsAutocastOnTheCpu) { expect_census_as_pytorchs("cpu"); }

TEST(LabOutputs, TheAmpLabsDtypeCensusIsPyTorchsAutocastOnTheGpu_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  expect_census_as_pytorchs("cuda");
}

// The sharded lab on 3 CPU ranks (a shard that does not divide evenly), as a student reads it in
// summary.json: each stage's collectives send what the formula says a rank must (ZeRO-3 half as
// much again as DDP: every layer gathered for forward and again for backward, reduce-scattered
// once), within the shards' padding; the losses agree; ZeRO-3's checkpoint comes back to the bit.
TEST(LabOutputs, TheShardedLabSendsWhatTheFormulaSaysAndItsCheckpointComesBack) {
  test::TempDir dir;
  std::string out;
  ASSERT_EQ(test::run({lab_binary("amplab-run"), "--nproc-per-node", "3", "--", lab_binary("sharded_training"), "--set",
                       "run.device=cpu", "--set", "model.width=52", "--set", "model.layers=3", "--set", "train.steps=4",
                       "--set", "train.warmup=1", "--set", "run.out_dir=" + dir.file("runs")},
                      &out),
            0)
      << out;
  const auto run = std::filesystem::directory_iterator(dir.file("runs/sharded_training"))->path();
  const auto summary = nlohmann::json::parse(read_file((run / "summary.json").string()));
  const auto& stages = summary.at("stages");
  ASSERT_EQ(stages.size(), 4u) << stages;
  const double num_params = 3 * (52 * 52 + 52), padding_per_unit = 1;  // 2756 elements per Linear: 919 x 3 - 1
  for (const auto& stage : stages) {
    EXPECT_EQ(stage.at("outcome"), "trained") << stage;
    const double sent = stage.at("sent_bytes"), expected = stage.at("expected_sent_bytes");
    EXPECT_GE(sent, expected - 1e-6) << stage;
    EXPECT_LE(sent, expected + 3 * 3 * padding_per_unit * 4) << stage;  // at most 3 collectives of 3 units' padding
  }
  EXPECT_NEAR(stages[0].at("expected_sent_bytes").get<double>(), 2.0 / 3 * 2 * 4 * num_params, 1e-6);
  EXPECT_NEAR(stages[3].at("expected_sent_bytes").get<double>() / stages[0].at("expected_sent_bytes").get<double>(), 1.5, 1e-12);
  EXPECT_TRUE(summary.at("losses_match").get<bool>()) << summary.at("largest_relative_loss_difference");
  EXPECT_TRUE(summary.at("checkpoint").at("restored_to_the_bit").get<bool>()) << summary.at("checkpoint");
}

TEST(BadInput, ARunThatCannotTrainIsRefusedInOneLine) {
  test::TempDir dir;
  write_tiny_dataset(dir);
  struct Case {
    std::vector<std::string> extra;
    std::string message;
  };
  std::vector<Case> cases = {
      {{"--set", "train.batch_size=100000"}, "train.batch_size=100000 "},
      {{"--set", "mnist.modes=[]"}, "mnist.modes is empty"},
      {{"--set", "run.device=tpu"}, "run.device: expected auto, cpu, cuda or cuda:N"},
  };
  for (const auto& c : cases) {
    auto args = mnist_args(dir, 1);
    args.insert(args.end(), c.extra.begin(), c.extra.end());
    std::string out;
    EXPECT_EQ(test::run(args, &out), 2) << out;
    EXPECT_NE(out.find("error: "), std::string::npos) << out;
    EXPECT_NE(out.find(c.message, out.find("error: ")), std::string::npos) << "expected \"" << c.message << "\" in: " << out;
    EXPECT_EQ(out.find("\n", out.find("error: ")), out.size() - 1) << "one line, the last: " << out;
  }
}

// A SIGINT ignored when the program starts (nohup, `cmd &` in a script) stays ignored; SIGTERM
// still stops the run with a checkpoint.
TEST(Interrupt, AnInheritedIgnoredSigintStaysIgnored) {
  test::TempDir dir;
  write_tiny_dataset(dir);
  std::string command = "trap '' INT; exec";
  for (const auto& a : mnist_args(dir, 50)) command += " '" + a + "'";
  test::Child child({"/bin/bash", "-c", command});
  ASSERT_TRUE(child.wait_for_output("[cpu] epoch 1/50", 60)) << child.output();
  child.signal(SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(child.output().find("interrupt received"), std::string::npos) << child.output();
  child.signal(SIGTERM);
  EXPECT_EQ(child.wait(60), 128 + SIGTERM) << child.output();
  EXPECT_NE(child.output().find("checkpoint saved to "), std::string::npos) << child.output();
}

// A checkpoint of another lab is named as such, not blamed on this lab's settings.
TEST(Resume, AnotherLabsCheckpointIsRefusedByName) {
  test::TempDir dir;
  write_tiny_dataset(dir);
  std::string out;
  std::vector<std::string> ddp = {lab_binary("ddp"), "--set", "run.device=cpu", "--set", "data.dir=" + dir.file("data"),
                                  "--set", "run.out_dir=" + dir.file("ddp_runs"), "--set", "train.batch_size=16",
                                  "--set", "train.progress=false"};
  ASSERT_EQ(test::run(ddp, &out), 0) << out;
  std::string ddp_checkpoint;  // the ddp run's checkpoint, named by its path
  for (const auto& entry : std::filesystem::directory_iterator(dir.file("ddp_runs") + "/ddp/checkpoints"))
    if (entry.path().extension() == ".ckpt") ddp_checkpoint = entry.path().string();
  ASSERT_FALSE(ddp_checkpoint.empty());
  auto mnist = mnist_args(dir, 1);
  mnist.insert(mnist.end(), {"--resume", ddp_checkpoint});
  EXPECT_EQ(test::run(mnist, &out), 2) << out;
  EXPECT_NE(out.find("was written by the ddp lab, not by mnist"), std::string::npos) << out;
  // Through `latest` of a checkpoint.dir that is not this out_dir's own: never another run's.
  mnist = mnist_args(dir, 1);
  mnist.insert(mnist.end(), {"--set", "checkpoint.dir=" + dir.file("ddp_runs") + "/ddp/checkpoints", "--resume", "latest"});
  EXPECT_EQ(test::run(mnist, &out), 2) << out;
  EXPECT_NE(out.find("no checkpoint of a run under this run.out_dir"), std::string::npos) << out;
  // run.device=cuda where there is no GPU is an error, not a quiet run on the CPU.
  if (!torch::cuda::is_available()) {
    ddp.insert(ddp.end(), {"--set", "run.device=cuda"});
    EXPECT_EQ(test::run(ddp, &out), 2) << out;
    EXPECT_NE(out.find("no CUDA device is available"), std::string::npos) << out;
  }
}

// ---- The terminal: a console whose reader is gone, a hang-up, closed descriptors --------------

// A bash command line that runs mnist with `args`, each quoted.
std::string shell_words(const std::vector<std::string>& args) {
  std::string words;
  for (const auto& a : args) words += " '" + a + "'";
  return words;
}

// The run's log file (runs/mnist/<stamp>/mnist.log) once it holds `needle`; "" after `timeout_s`.
std::string wait_for_log(const test::TempDir& dir, const std::string& needle, double timeout_s) {
  for (double waited = 0; waited < timeout_s; waited += 0.1) {
    std::error_code ec;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir.file("runs"), ec)) {
      if (e.path().filename() != "mnist.log") continue;
      std::string text = read_file(e.path().string());
      if (text.find(needle) != std::string::npos) return text;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return "";
}

// The checkpoint an interrupted run names in its log file, and that it resumes to the end.
void expect_saved_and_resumable(const test::TempDir& dir, const std::string& log) {
  auto saved = log.find("checkpoint saved to ");
  ASSERT_NE(saved, std::string::npos) << log;
  std::string path = log.substr(saved + 20, log.find(';', saved) - saved - 20);
  EXPECT_EQ(read_checkpoint_info(path).lab, "mnist");
  auto args = mnist_args(dir, 50);
  args.insert(args.end(), {"--set", "train.epochs=3", "--resume", path, "--force"});
  std::string out;
  EXPECT_EQ(test::run(args, &out, 120), 0) << out;
  EXPECT_NE(out.find("resumed from " + path), std::string::npos) << out;
}

// `mnist 2>&1 | tee log` and Ctrl-C: tee dies first, and the run's next console line meets a
// pipe with no reader. The run must not die of SIGPIPE before it saves: the interrupt saves a
// checkpoint that resumes, and the log file has every line the console lost.
TEST(Terminal, AnInterruptAfterTheConsoleReaderDiedStillSaves) {
  test::TempDir dir;
  write_tiny_dataset(dir);
  // exec: the child is mnist itself; its console is a pipe whose reader leaves after one byte.
  test::Child child({"/bin/bash", "-c", "exec" + shell_words(mnist_args(dir, 50)) + " 2> >(head -c 1 >/dev/null) >&2"});
  ASSERT_FALSE(wait_for_log(dir, "[cpu] epoch 1/50 2/", 60).empty()) << "the run did not train on";
  child.signal(SIGINT);
  EXPECT_EQ(child.wait(60), 130);
  std::string log = wait_for_log(dir, "interrupted at epoch", 5);
  ASSERT_FALSE(log.empty()) << "no 'interrupted at' in the log file";
  expect_saved_and_resumable(dir, log);
}

// A closed terminal (SIGHUP) stops the run as SIGTERM does: after the step, with a checkpoint.
// Started with stdout and stderr closed, nothing the run opens takes their numbers: the
// checkpoint directory's lock file holds its one line, not the console's.
TEST(Terminal, AHangUpWithClosedDescriptorsSavesAndTheLockFileStaysClean) {
  test::TempDir dir;
  write_tiny_dataset(dir);
  test::Child child({"/bin/bash", "-c", "exec" + shell_words(mnist_args(dir, 50)) + " <&- >&- 2>&-"});
  ASSERT_FALSE(wait_for_log(dir, "[cpu] epoch 1/50 2/", 60).empty()) << "the run did not train on";
  child.signal(SIGHUP);
  EXPECT_EQ(child.wait(60), 128 + SIGHUP);
  std::string lock = read_file(dir.file("runs/mnist/checkpoints/.lock"));
  EXPECT_EQ(lock.rfind("pid ", 0), 0u) << lock;
  EXPECT_EQ(std::count(lock.begin(), lock.end(), '\n'), 1) << lock;
  std::string log = wait_for_log(dir, "interrupted at epoch", 5);
  ASSERT_FALSE(log.empty()) << "no 'interrupted at' in the log file";
  expect_saved_and_resumable(dir, log);
}

// A full disk (here a file-size limit, ulimit -f) never loses output silently: the run ends with
// exit code 4 naming the file, not 0, and not killed by SIGXFSZ (the run ignores it itself).
TEST(DiskFull, OutputThatCannotBeWrittenFailsTheRunNamingTheFile) {
  test::TempDir dir;
  write_tiny_dataset(dir);
  std::string command = "ulimit -f 4; exec";  // 4 KiB per file: the log outgrows it
  for (const auto& a : mnist_args(dir, 2)) command += " '" + a + "'";
  command += " --set checkpoint.every_epoch=false --set checkpoint.on_interrupt=false --set memory.timeline=false";
  std::string out;
  EXPECT_EQ(test::run({"/bin/bash", "-c", command}, &out), 4) << out;
  // Whichever file fills first: the log (its lines kept in memory, the bytes not written counted at
  // the end) or a file written whole (report.md, a CSV), named as the run sees it.
  EXPECT_TRUE(out.find("bytes not written") != std::string::npos ||
              out.find("error: cannot write '" + dir.file("runs/mnist")) != std::string::npos) << out;
  EXPECT_EQ(out.find(".tmp-"), std::string::npos) << "a temporary file's name in the error: " << out;
  EXPECT_NE(out.find("free disk space"), std::string::npos) << out;
}

// ---- Distributed runs through both launchers (CPU backend) -------------------------------------

std::string torchrun() {
  std::string path = test::source_dir() + "/.venv/bin/torchrun";
  return std::filesystem::exists(path) ? path : "";
}

std::vector<std::string> ddp_args(const test::TempDir& dir, const std::string& out_dir, int epochs) {
  return {lab_binary("ddp"),
          "--set", "run.device=cpu",
          "--set", "data.dir=" + dir.file("data"),
          "--set", "run.out_dir=" + dir.file(out_dir),
          "--set", "train.epochs=" + std::to_string(epochs),
          "--set", "train.batch_size=16",
          "--set", "train.log_every=2",
          "--set", "train.progress=false",
          "--set", "run.deterministic=true",
          "--set", "dist.timeout_s=120"};
}

std::vector<std::string> launched(const std::string& launcher, std::vector<std::string> args, int nproc,
                                  const std::vector<std::string>& extra = {}) {
  std::vector<std::string> out;
  if (launcher == "amplab-run") out = {lab_binary("amplab-run"), "--nproc-per-node", std::to_string(nproc), "--grace-period", "30"};
  else out = {torchrun(), "--nproc-per-node", std::to_string(nproc), "--no-python"};
  bool one_node = std::find(extra.begin(), extra.end(), "--nnodes") == extra.end();
  if (launcher == "torchrun" && one_node) out.push_back("--standalone");
  out.insert(out.end(), extra.begin(), extra.end());
  if (launcher == "amplab-run") out.push_back("--");
  out.insert(out.end(), args.begin(), args.end());
  return out;
}

// The fingerprint (CRC-32 of every parameter) rank 0 prints at the end.
std::string fingerprint(const std::string& output) {
  auto at = output.find("parameters identical on all 2 rank(s): yes (crc32 ");
  return at == std::string::npos ? "" : output.substr(at + 51, 8);
}

// The pid of rank `rank` of the job whose workers inherited AMPLAB_TEST_MARK=mark.
pid_t worker_pid(int rank, const std::string& mark) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string environ, cmdline;
    try {
      environ = read_file(entry.path().string() + "/environ");
      cmdline = read_file(entry.path().string() + "/cmdline");
    } catch (const std::exception&) {
      continue;
    }
    std::string env = "\n" + environ;
    std::replace(env.begin(), env.end(), '\0', '\n');
    if (cmdline.find("bin/ddp") == std::string::npos) continue;
    if (env.find("\nAMPLAB_TEST_MARK=" + mark + "\n") != std::string::npos &&
        env.find("\nRANK=" + std::to_string(rank) + "\n") != std::string::npos)
      return static_cast<pid_t>(std::stoi(name));
  }
  return -1;
}

class DistributedRun : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "torchrun" && torchrun().empty()) GTEST_SKIP() << "no .venv/bin/torchrun";
    mark_ = std::to_string(::getpid()) + "-" + std::to_string(counter_++);
    setenv("AMPLAB_TEST_MARK", mark_.c_str(), 1);
    setenv("OMP_NUM_THREADS", "1", 1);
  }
  void TearDown() override { unsetenv("AMPLAB_TEST_MARK"); }
  std::string mark_;
  static inline int counter_ = 0;
};

// Rank 1 killed mid-run: rank 0, stuck in an all-reduce with a 120 s timeout, stops within
// seconds of the launcher's SIGTERM by itself (not SIGKILLed), naming rank 1 and the last good
// checkpoint.
TEST_P(DistributedRun, ASurvivorOfADeadRankStopsNamingIt) {
  test::TempDir dir;
  write_tiny_dataset(dir);
  test::Child job(launched(GetParam(), ddp_args(dir, "runs", 200), 2));
  ASSERT_TRUE(job.wait_for_output("epoch 2/200", 120)) << job.output();
  pid_t victim = worker_pid(1, mark_);
  ASSERT_GT(victim, 0) << job.output();
  ::kill(victim, SIGKILL);
  EXPECT_NE(job.wait(90), -1) << "the job hung: " << job.output();
  const std::string& out = job.output();
  EXPECT_NE(out.find("rank 1 stopped responding"), std::string::npos) << out;
  EXPECT_NE(out.find("the last good checkpoint is"), std::string::npos) << out;
  if (GetParam() == "amplab-run") EXPECT_NE(out.find("rank 0 also failed: it exited with code 1"), std::string::npos) << out;
}

// torchrun's (and amplab-run's) --max-restarts: after a rank is killed, the restarted workers
// go on from the latest checkpoint (--resume auto) and end with the parameters of a run that
// was never interrupted, to the bit.
TEST_P(DistributedRun, AnElasticRestartEndsWithTheParametersOfAnUninterruptedRun) {
  test::TempDir dir;
  write_tiny_dataset(dir);
  auto reference_args = ddp_args(dir, "reference", 6);
  std::string reference_out;
  ASSERT_EQ(test::run(launched("amplab-run", reference_args, 2), &reference_out, 300), 0) << reference_out;
  std::string reference = fingerprint(reference_out);
  ASSERT_FALSE(reference.empty()) << reference_out;

  auto args = ddp_args(dir, "restarted", 6);
  args.insert(args.end(), {"--resume", "auto"});
  test::Child job(launched(GetParam(), args, 2, {"--max-restarts", "1"}));
  ASSERT_TRUE(job.wait_for_output("epoch 3/6", 120)) << job.output();
  pid_t victim = worker_pid(1, mark_);
  ASSERT_GT(victim, 0) << job.output();
  ::kill(victim, SIGKILL);
  EXPECT_EQ(job.wait(300), 0) << job.output();
  EXPECT_NE(job.output().find("resumed from "), std::string::npos) << job.output();
  EXPECT_EQ(fingerprint(job.output()), reference) << job.output();
}

// Two nodes simulated on one host (--nnodes 2, --node-rank 0 and 1, one shared store address):
// the same parameters as two workers on one node.
TEST_P(DistributedRun, TwoNodesOnOneHostTrainLikeOneNode) {
  test::TempDir dir;
  write_tiny_dataset(dir);
  std::string one_node_out;
  ASSERT_EQ(test::run(launched("amplab-run", ddp_args(dir, "one", 2), 2), &one_node_out, 300), 0) << one_node_out;
  int port = 20000 + static_cast<int>(::getpid() % 20000);
  std::vector<std::unique_ptr<test::Child>> nodes;
  for (int node = 0; node < 2; ++node) {
    std::vector<std::string> extra = {"--nnodes", "2", "--node-rank", std::to_string(node), "--master-addr", "127.0.0.1",
                                      "--master-port", std::to_string(port)};
    nodes.push_back(std::make_unique<test::Child>(
        launched(GetParam(), ddp_args(dir, "node" + std::to_string(node), 2), 1, extra)));
  }
  for (auto& node : nodes) EXPECT_EQ(node->wait(300), 0) << node->output();
  EXPECT_EQ(fingerprint(nodes[0]->output()), fingerprint(one_node_out)) << nodes[0]->output();
  EXPECT_FALSE(fingerprint(one_node_out).empty()) << one_node_out;
}

// A checkpoint written by 2 processes, resumed by 1: refused, naming the world size, unless --force.
TEST(Resume, ACheckpointOfTwoProcessesNeedsForceInOne) {
  test::TempDir dir;
  write_tiny_dataset(dir);
  setenv("OMP_NUM_THREADS", "1", 1);
  std::string out;
  ASSERT_EQ(test::run(launched("amplab-run", ddp_args(dir, "runs", 1), 2), &out, 300), 0) << out;
  auto alone = ddp_args(dir, "runs", 2);
  alone.insert(alone.end(), {"--resume", "latest"});
  EXPECT_EQ(test::run(alone, &out), 2) << out;
  EXPECT_NE(out.find("the number of processes (WORLD_SIZE) is 1 now but was 2"), std::string::npos) << out;
  alone.push_back("--force");
  EXPECT_EQ(test::run(alone, &out), 0) << out;
  EXPECT_NE(out.find("resumed from "), std::string::npos) << out;
}

INSTANTIATE_TEST_SUITE_P(Launchers, DistributedRun, ::testing::Values("amplab-run", "torchrun"),
                         [](const auto& info) { return info.param == "amplab-run" ? std::string("AmplabRun") : std::string("Torchrun"); });

}  // namespace
}  // namespace amplab
