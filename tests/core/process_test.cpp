// Whole-process behaviour of a lab binary (build/bin/mnist on a tiny made-up dataset, CPU):
// Ctrl-C/SIGTERM save a checkpoint and exit 130/143, the checkpoint loads and the resumed run
// finishes; a second signal exits at once; kill -9 during checkpoint writes never breaks the
// previous checkpoint; bad input ends in one line and exit code 2.
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <thread>

#include "amplab/checkpoint.hpp"
#include "amplab/data/idx.hpp"
#include "amplab/files.hpp"
#include "process.hpp"
#include "support.hpp"

namespace amplab {
namespace {

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
          "--set", "mnist.cpu_epochs=" + std::to_string(epochs),
          "--set", "mnist.plots=false",
          "--set", "train.batch_size=8",
          "--set", "train.log_every=1",
          "--set", "train.progress=false",
          "--set", "run.deterministic=true"};
}

class Interrupt : public ::testing::TestWithParam<int> {};

// Several trials at random moments: SIGINT (and SIGTERM in odd trials) once training runs.
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
  args.push_back("mnist.cpu_epochs=2");  // finish quickly: the checkpoint is in epoch 1 or 2
  args.push_back("--resume");
  args.push_back(path);
  if (info.position.epoch >= 2) GTEST_SKIP() << "interrupted after epoch 2; nothing left to resume with 2 epochs";
  std::string resumed;
  EXPECT_EQ(test::run(args, &resumed, 120), 0) << resumed;
  EXPECT_NE(resumed.find("resumed from " + path), std::string::npos) << resumed;
  EXPECT_NE(resumed.find("results: "), std::string::npos) << resumed;
}

INSTANTIATE_TEST_SUITE_P(Trials, Interrupt, ::testing::Values(1, 2, 3, 4, 5, 6));

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
}

}  // namespace
}  // namespace amplab
