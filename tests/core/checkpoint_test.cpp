// Checkpoint contents, integrity errors and the checkpoint directory.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>

#include "amplab/infra/append_file.hpp"
#include "amplab/state/checkpoint.hpp"
#include "amplab/infra/files.hpp"
#include "grad_scaler.hpp"  // lab 2's (the reference here)
#include "support.hpp"

namespace amplab {
namespace {

struct Model : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
  explicit Model(int64_t width = 5) {
    fc = register_module("fc", torch::nn::Linear(4, width));
    norm = register_module("norm", torch::nn::BatchNorm1d(width));
  }
  torch::Tensor forward(const torch::Tensor& x) { return norm(fc(x)); }
};

struct Toy {
  std::shared_ptr<Model> model;
  std::unique_ptr<torch::optim::Adam> optimizer;
  amp_training::GradScaler scaler;
  explicit Toy(int64_t width = 5) : model(std::make_shared<Model>(width)) {
    optimizer = std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(0.01));
  }
  TrainingState state() { return {*model, *optimizer, scaler}; }
  void train(int steps) {
    for (int i = 0; i < steps; ++i) {
      optimizer->zero_grad();
      scaler.scale(model->forward(torch::randn({8, 4})).pow(2).mean()).backward();
      scaler.step(*optimizer);
      scaler.update();
    }
  }
};

CheckpointInfo info_at(int64_t step) {
  CheckpointInfo info;
  info.lab = "toy";
  info.tag = "t";
  info.config_yaml = "train:\n  lr: 0.1\n";
  info.position = {2, 6, step, 9};
  return info;
}

TEST(Checkpoint, RoundTripRestoresEverything) {
  test::TempDir dir;
  torch::manual_seed(1);
  Toy a;
  a.train(3);
  std::string path = dir.file("a.ckpt");
  save_checkpoint(path, a.state(), info_at(3));
  auto expected_next_random = torch::randn({4});

  torch::manual_seed(99);
  Toy b;
  auto state = b.state();
  CheckpointInfo info = load_checkpoint(path, state, "toy");
  EXPECT_EQ(info.position.epoch, 2);
  EXPECT_EQ(info.position.next_batch, 6);
  EXPECT_EQ(info.position.global_step, 3);
  EXPECT_EQ(info.position.data_seed, 9u);
  EXPECT_EQ(info.config_yaml, "train:\n  lr: 0.1\n");
  EXPECT_EQ(info.lab, "toy");
  for (size_t i = 0; i < a.model->parameters().size(); ++i)
    EXPECT_TRUE(test::tensors_equal(b.model->parameters()[i], a.model->parameters()[i]));
  EXPECT_TRUE(test::tensors_equal(b.model->norm->running_mean, a.model->norm->running_mean));
  EXPECT_EQ(b.scaler.get_scale(), a.scaler.get_scale());
  EXPECT_EQ(b.scaler.growth_tracker(), 3);
  EXPECT_TRUE(test::tensors_equal(torch::randn({4}), expected_next_random));  // RNG restored
  // Same optimizer moments: one more identical step keeps the models identical.
  torch::manual_seed(5);
  a.train(1);
  torch::manual_seed(5);
  b.train(1);
  for (size_t i = 0; i < a.model->parameters().size(); ++i)
    EXPECT_TRUE(test::tensors_equal(b.model->parameters()[i], a.model->parameters()[i]));
}

// The format, version by version. tests/fixtures/checkpoint_v1.ckpt was written by version 1's
// save_checkpoint (before each entry had one description): a Toy of width 3 trained 3 steps from
// seed 1, at info_at(3) with samples 48, world size 1, meta_loop '{"epochs": []}' and meta_extra
// '{"kept": true}'. (Its values are compared with the file's own, not with a Toy trained again:
// Adam's first steps amplify another CPU's last-bit differences.)
const std::string kVersion1File = std::string(AMPLAB_SOURCE_DIR) + "/tests/fixtures/checkpoint_v1.ckpt";

TEST(CheckpointFormat, AFileOfVersion1StillLoads) {
  Toy loaded(3);
  auto state = loaded.state();
  const CheckpointInfo info = load_checkpoint(kVersion1File, state, "toy");
  EXPECT_EQ(info.format_version, 1u);
  EXPECT_EQ(info.position.global_step, 3);
  EXPECT_EQ(info.position.data_seed, 9u);
  EXPECT_EQ(info.position.samples, 48);
  EXPECT_EQ(info.loop_json, "{\"epochs\": []}");
  EXPECT_EQ(info.extra_json, "{\"kept\": true}");
  // The model's tensors are the file's, read here with torch's archive alone (the 24-byte header
  // skipped), in the order version 1 wrote them: parameters, then buffers.
  const std::string bytes = read_file(kVersion1File);
  torch::serialize::InputArchive archive;
  archive.load_from(bytes.data() + 24, bytes.size() - 24);
  std::vector<torch::Tensor> mine;
  for (const auto& p : loaded.model->parameters()) mine.push_back(p);
  for (const auto& b : loaded.model->buffers()) mine.push_back(b);
  for (size_t i = 0; i < mine.size(); ++i) {
    torch::Tensor stored;
    ASSERT_TRUE(archive.try_read("model_t" + std::to_string(i), stored, /*is_buffer=*/true)) << i;
    EXPECT_TRUE(test::tensors_equal(mine[i], stored));
  }
  EXPECT_EQ(loaded.scaler.growth_tracker(), 3);
}

TEST(CheckpointFormat, TodaysFilesCarryTodaysVersionInHeaderAndArchive) {
  test::TempDir dir;
  Toy toy;
  save_checkpoint(dir.file("now.ckpt"), toy.state(), info_at(1));
  EXPECT_EQ(read_checkpoint_info(dir.file("now.ckpt")).format_version, kCheckpointFormatVersion);
  EXPECT_EQ(read_file(dir.file("now.ckpt"))[8], static_cast<char>(kCheckpointFormatVersion));
}

TEST(CheckpointFormat, AnArchiveOfAnotherVersionThanItsHeaderIsRefusedByName) {
  test::TempDir dir;
  std::string bytes = read_file(kVersion1File);
  bytes[8] = 2;  // the header now claims version 2 over a version 1 archive (the checksum covers the archive only)
  const std::string path = dir.write("pieced.ckpt", bytes);
  EXPECT_TRUE(test::throws_with([&] { read_checkpoint_info(path); },
                                {path, "inconsistent", "header says format version 2", "its archive 1"}));
}

class CorruptCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::manual_seed(1);
    good_ = dir_.file("good.ckpt");
    save_checkpoint(good_, setup_.state(), info_at(1));
    bytes_ = read_file(good_);
  }
  // Loading `bytes` into a fresh model must fail with `parts` and leave the model unchanged.
  void expect_rejected(const std::string& bytes, std::initializer_list<std::string> parts, int64_t width = 5) {
    std::string path = dir_.write("bad.ckpt", bytes);
    Toy fresh(width);
    auto before = fresh.model->fc->weight.clone();
    auto state = fresh.state();
    EXPECT_TRUE(test::throws_with([&] { load_checkpoint(path, state, "toy"); }, parts));
    EXPECT_TRUE(test::tensors_equal(fresh.model->fc->weight, before)) << "a failed load changed the model";
  }
  test::TempDir dir_;
  Toy setup_;
  std::string good_, bytes_;
};

TEST_F(CorruptCheckpoint, Truncated) {
  expect_rejected(bytes_.substr(0, bytes_.size() - 100), {"bad.ckpt", "truncated"});
  expect_rejected(bytes_.substr(0, 10), {"bad.ckpt", "not an amplab checkpoint"});
}

TEST_F(CorruptCheckpoint, BitFlipAnywhereInTheData) {
  for (size_t offset : {size_t{30}, bytes_.size() / 2, bytes_.size() - 1}) {
    std::string flipped = bytes_;
    flipped[offset] ^= 0x10;
    expect_rejected(flipped, {"bad.ckpt", "corrupt", "checksum"});
  }
}

TEST_F(CorruptCheckpoint, WrongFormat) {
  expect_rejected("PK\x03\x04 this is a zip, perhaps a torch.save file", {"not an amplab checkpoint"});
  expect_rejected("", {"not an amplab checkpoint"});
}

TEST_F(CorruptCheckpoint, WrongVersion) {
  std::string newer = bytes_;
  newer[8] = 7;  // format version field
  expect_rejected(newer, {"format version 7", "this build reads versions 1 to 2", "newer amplab"});
}

TEST_F(CorruptCheckpoint, WrongModelNamesTheFirstMismatchingTensor) {
  expect_rejected(bytes_, {"does not match the model", "'param:fc.weight'", "[5, 4]", "[6, 4]"}, /*width=*/6);
}

TEST_F(CorruptCheckpoint, WrongLab) {
  Toy fresh;
  auto state = fresh.state();
  EXPECT_TRUE(test::throws_with([&] { load_checkpoint(good_, state, "mnist"); }, {"written by the toy lab, not by mnist", "that lab's binary"}));
}

TEST_F(CorruptCheckpoint, MissingFile) {
  Toy fresh;
  auto state = fresh.state();
  EXPECT_TRUE(test::throws_with([&] { load_checkpoint(dir_.file("nope.ckpt"), state, "toy"); }, {"nope.ckpt", "does not exist"}));
}

TEST(CheckpointManager, KeepsTheLastKAndPointsLatestAtTheNewest) {
  test::TempDir dir;
  Toy s;
  CheckpointManager manager(dir.file("ckpts"), 2);
  for (int64_t step : {1, 2, 3, 4}) manager.save(s.state(), info_at(step));
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir.file("ckpts"))) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{".lock", "latest", "step-00000003.ckpt", "step-00000004.ckpt"}));
  EXPECT_EQ(manager.resolve("latest"), dir.file("ckpts") + "/step-00000004.ckpt");
  EXPECT_EQ(read_checkpoint_info(manager.resolve("latest")).position.global_step, 4);
}

// Runs that share a directory one after the other prune only their own files: the checkpoint an
// interrupted run printed survives the next run, whatever its step numbers.
TEST(CheckpointManager, PrunesOnlyItsOwnFiles) {
  test::TempDir dir;
  Toy s;
  {
    CheckpointManager interrupted(dir.file("ckpts"), 1, "20261123-101010-cpu");
    interrupted.save(s.state(), info_at(7));
  }
  std::string kept = dir.file("ckpts") + "/20261123-101010-cpu-step-00000007.ckpt";
  ASSERT_TRUE(std::filesystem::exists(kept));
  CheckpointManager next(dir.file("ckpts"), 1, "20261123-111111-cpu");
  for (int64_t step : {1, 2, 7, 8}) next.save(s.state(), info_at(step));
  EXPECT_TRUE(std::filesystem::exists(kept));
  EXPECT_EQ(read_checkpoint_info(kept).position.global_step, 7);
  EXPECT_EQ(next.resolve("latest"), dir.file("ckpts") + "/20261123-111111-cpu-step-00000008.ckpt");
  EXPECT_FALSE(std::filesystem::exists(dir.file("ckpts") + "/20261123-111111-cpu-step-00000007.ckpt"));
  EXPECT_EQ(file_name_safe("gpu-amp (bf16-mixed)"), "gpu-amp_bf16-mixed");
}

// A second run writing into the same directory at the same time is refused at once, naming the
// first; a directory that cannot be made is an error before training, not after an epoch.
TEST(CheckpointManager, OneWriterAtATimeAndUnwritableDirectoriesFailEarly) {
  test::TempDir dir;
  CheckpointManager first(dir.file("ckpts"), 2, "run-a");
  first.open_for_writing();
  CheckpointManager second(dir.file("ckpts"), 2, "run-b");
  EXPECT_TRUE(test::throws_with([&] { second.open_for_writing(); }, {"is in use by another run", "run-a", "checkpoint.dir"}));
  std::string file = dir.write("a-file", "x");
  CheckpointManager nowhere(file + "/ckpts", 2);
  EXPECT_TRUE(test::throws_with([&] { nowhere.open_for_writing(); }, {"checkpoint.dir: cannot create", "a-file/ckpts"}));
}

// What a write killed by SIGKILL leaves behind is removed by the next writer.
TEST(CheckpointManager, RemovesTemporaryFilesOfKilledWrites) {
  test::TempDir dir;
  std::filesystem::create_directories(dir.file("ckpts"));
  std::string stale = dir.write("ckpts/.step-00000003.ckpt.tmp-12345", "half a checkpoint");
  CheckpointManager manager(dir.file("ckpts"), 2);
  manager.open_for_writing();
  EXPECT_FALSE(std::filesystem::exists(stale));
}

TEST(CheckpointManager, ResolveErrors) {
  test::TempDir dir;
  CheckpointManager manager(dir.file("empty"), 2);
  EXPECT_TRUE(test::throws_with([&] { manager.resolve("latest"); }, {"no checkpoint in", "empty"}));
  EXPECT_TRUE(test::throws_with([&] { manager.resolve("/nope.ckpt"); }, {"/nope.ckpt", "does not exist"}));
  // A damaged `latest` is named as such, its bytes shown printable.
  std::filesystem::create_directories(dir.file("empty"));
  dir.write("empty/latest", std::string("\x01\x02garbage\xff", 11));
  EXPECT_TRUE(test::throws_with([&] { manager.resolve("latest"); }, {"is damaged", "??garbage?"}));
}

// With a pointer directory (<run.out_dir>/<lab>, beside the run directories) the run's own
// `latest` names its file relative to itself (absolute when outside it) and is read first; the
// checkpoint directory's `latest`, the newest file of any run, only when the run's is missing.
// A checkpoint.dir that is not the out_dir's own may be shared with runs of other out_dirs: its
// `latest` may name one of theirs, so a run without its own pointer never resumes from it.
TEST(CheckpointManager, ASharedDirectorysLatestIsNeverAnotherOutDirsResume) {
  test::TempDir dir;
  Toy s;
  const std::string shared = dir.file("shared"), mine = dir.file("c/toy");
  std::filesystem::create_directories(mine);
  std::filesystem::create_directories(dir.file("d/toy"));
  CheckpointManager(shared, 2, "other", dir.file("d/toy")).save(s.state(), info_at(4));  // another out_dir's run
  const CheckpointManager checkpoints(shared, 2, "", mine);
  EXPECT_FALSE(checkpoints.has_latest());  // --resume auto: a fresh start
  EXPECT_TRUE(test::throws_with([&] { checkpoints.resolve("latest"); },
                                {"no checkpoint of a run under this run.out_dir", mine, "pass a checkpoint path"}));
  EXPECT_TRUE(CheckpointManager(shared, 2).has_latest());  // without a run directory: the directory's, as before
}

TEST(CheckpointManager, TheRunsLatestIsReadFirstAndTheDirectorysWhenItIsMissing) {
  test::TempDir dir;
  Toy s;
  const std::string runs = dir.file("a/toy"), checkpoints = dir.file("a/toy/checkpoints");
  std::filesystem::create_directories(runs);
  // One writer at a time holds the directory: each run saves, then lets go.
  auto save_as = [&](const std::string& owner, const std::string& pointer_dir, int64_t step) {
    return CheckpointManager(checkpoints, 2, owner, pointer_dir).save(s.state(), info_at(step));
  };
  const std::string saved = save_as("mine", runs, 1);
  EXPECT_EQ(read_file(runs + "/latest"), "checkpoints/mine-step-00000001.ckpt\n");
  const std::string theirs = save_as("other", "", 2);  // a run of another out_dir, written last
  const CheckpointManager mine(checkpoints, 2, "", runs), directory(checkpoints, 2);
  EXPECT_EQ(mine.resolve("latest"), saved);
  EXPECT_EQ(directory.resolve("latest"), theirs);
  // A pointer directory that holds no checkpoints: the file by its absolute path.
  std::filesystem::create_directories(dir.file("b/toy"));
  const std::string far = std::filesystem::absolute(save_as("elsewhere", dir.file("b/toy"), 3)).lexically_normal().string();
  EXPECT_EQ(read_file(dir.file("b/toy/latest")), far + "\n");
  EXPECT_EQ(CheckpointManager(checkpoints, 2, "", dir.file("b/toy")).resolve("latest"), far);
  // Written before the run's pointer existed: the directory's is read.
  std::filesystem::remove(runs + "/latest");
  EXPECT_TRUE(mine.has_latest());
  EXPECT_EQ(mine.resolve("latest"), checkpoints + "/elsewhere-step-00000003.ckpt");
  // A damaged or dangling pointer of the run is named, with what to do.
  dir.write("a/toy/latest", std::string("\x01" "bad\n"));
  EXPECT_TRUE(test::throws_with([&] { mine.resolve("latest"); }, {runs + "/latest", "is damaged", "?bad", "pass a checkpoint path"}));
  dir.write("a/toy/latest", "checkpoints/gone.ckpt\n");
  EXPECT_TRUE(test::throws_with([&] { mine.resolve("latest"); }, {runs + "/latest", "names 'checkpoints/gone.ckpt'", "pass a path"}));
  // Neither pointer: both places are named.
  const CheckpointManager none(dir.file("none/checkpoints"), 2, "", dir.file("none"));
  EXPECT_FALSE(none.has_latest());
  EXPECT_TRUE(test::throws_with([&] { none.resolve("latest"); }, {"no checkpoint in", "none/checkpoints", "nor in"}));
}

// Special files are refused before anything is read from them: a FIFO with no writer would
// block forever, /dev/zero would be read until memory runs out. A dangling `latest` link, and an
// unreadable file, say so.
TEST(CheckpointManager, SpecialFilesAndDanglingLinksAreNamedAsSuch) {
  test::TempDir dir;
  std::filesystem::create_directories(dir.file("ckpts"));
  CheckpointManager manager(dir.file("ckpts"), 2);
  ASSERT_EQ(::mkfifo(dir.file("fifo.ckpt").c_str(), 0600), 0);
  EXPECT_TRUE(test::throws_with([&] { manager.resolve(dir.file("fifo.ckpt")); }, {"fifo.ckpt", "named pipe (FIFO)"}));
  EXPECT_TRUE(test::throws_with([&] { read_checkpoint_info(dir.file("fifo.ckpt")); }, {"fifo.ckpt", "named pipe (FIFO)"}));
  EXPECT_TRUE(test::throws_with([&] { read_checkpoint_info("/dev/zero"); }, {"/dev/zero", "character device"}));
  EXPECT_TRUE(test::throws_with([&] { manager.resolve(dir.path().string()); }, {"is a directory"}));
  std::filesystem::create_symlink("gone.ckpt", dir.file("ckpts/latest"));
  EXPECT_TRUE(manager.has_latest());
  EXPECT_TRUE(test::throws_with([&] { manager.resolve("latest"); }, {"latest", "dangling symbolic link", "gone.ckpt"}));
  EXPECT_TRUE(test::throws_with([&] { manager.resolve("~/x.ckpt"); }, {"'~/x.ckpt'", "$HOME/x.ckpt"}));
}

// A checkpoint is read no further than its header says: a file whose size disagrees (a huge
// sparse file with a copied header) is refused from its header and size alone.
TEST(CheckpointManager, AFileLargerThanItsHeaderSaysIsRefusedUnread) {
  test::TempDir dir;
  Toy s;
  std::string good = dir.file("good.ckpt");
  save_checkpoint(good, s.state(), info_at(1));
  std::string bytes = read_file(good);
  std::string big = dir.file("big.ckpt");
  dir.write("big.ckpt", bytes.substr(0, 24));
  ASSERT_EQ(::truncate(big.c_str(), off_t{1} << 40), 0);  // 1 TiB, sparse
  EXPECT_TRUE(test::throws_with([&] { read_checkpoint_info(big); }, {"big.ckpt", "too long", "header promises"}));
}

// Two runs whose names coincide (the same clock second, one checkpoint.dir) never replace each
// other's files: a run writes only names it created, and every run's names differ.
TEST(CheckpointManager, NeverReplacesAnotherRunsFile) {
  test::TempDir dir;
  Toy s;
  {
    CheckpointManager first(dir.file("ckpts"), 2, "20261123-101010-cpu");
    first.save(s.state(), info_at(3));
  }
  CheckpointManager second(dir.file("ckpts"), 2, "20261123-101010-cpu");
  EXPECT_TRUE(test::throws_with([&] { second.save(s.state(), info_at(3)); },
                                {"20261123-101010-cpu-step-00000003.ckpt", "already exists", "not replacing it"}));
  EXPECT_NO_THROW(second.save(s.state(), info_at(4)));
  EXPECT_NO_THROW(second.save(s.state(), info_at(4)));  // its own file: replaced, as a re-save at one step does
  EXPECT_NE(unique_run_token(), unique_run_token());
  EXPECT_EQ(unique_run_token().size(), 6u);
}

TEST(AtomicWrite, ReplacesWholeFilesAndLeavesNoTemporary) {
  test::TempDir dir;
  std::string path = dir.file("f.txt");
  write_file_atomic(path, "first");
  write_file_atomic(path, "second");
  EXPECT_EQ(read_file(path), "second");
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) (void)e, ++entries;
  EXPECT_EQ(entries, 1);
  EXPECT_STREQ(atomic_write_in_progress(), "");
  EXPECT_TRUE(test::throws_with([&] { write_file_atomic(dir.file("missing/dir/f"), "x"); }, {"cannot create"}));
}

}  // namespace
}  // namespace amplab

namespace amplab {
namespace {

// A full disk, made with RLIMIT_FSIZE (writes past the limit fail, as on a full disk): what the
// disk refuses waits in memory, is written in order once there is room, and is reported if it
// never could be.
TEST(AppendFile, KeepsWhatTheDiskRefusesAndWritesItOnceThereIsRoom) {
  test::TempDir dir;
  std::string path = dir.file("metrics.csv");
  struct rlimit saved {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of the signal
  std::string expected;
  {
    AppendFile file(path, /*truncate=*/true);
    file.append("header\n");
    expected += "header\n";
    struct rlimit full = saved;
    full.rlim_cur = 20;  // bytes: the "disk" fills up
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &full), 0);
    for (int row = 1; row <= 5; ++row) {
      std::string line = "row " + std::to_string(row) + "\n";
      file.append(line);
      expected += line;
    }
    EXPECT_GT(file.pending_bytes(), 0u);
    EXPECT_FALSE(unwritten_files().empty());
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &saved), 0);  // room again
    file.append("row 6\n");
    expected += "row 6\n";
    EXPECT_EQ(file.pending_bytes(), 0u);
  }
  EXPECT_EQ(read_file(path), expected);
  EXPECT_TRUE(unwritten_files().empty());

  {
    AppendFile file(dir.file("lost.csv"), true);
    struct rlimit none = saved;
    none.rlim_cur = 0;
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &none), 0);
    file.append("never written\n");
  }
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &saved), 0);
  std::signal(SIGXFSZ, previous_handler);
  auto lost = unwritten_files();
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_NE(lost[0].find("lost.csv: 14 bytes not written"), std::string::npos) << lost[0];
}

}  // namespace
}  // namespace amplab
