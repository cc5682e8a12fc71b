// Graded tests of lab 5 (data-parallel training). Each test names the TODO it grades. The last
// ones start the lab binary on 2 and 3 CPU processes through amplab-run: they pass only if every
// rank finishes and all ranks end with bit-identical parameters.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>

#include "amplab/data/idx.hpp"
#include "ddp_lab.hpp"
#include "process.hpp"
#include "support.hpp"

namespace {
namespace test = amplab::test;

// Sets torchrun's variables for a one-process job for the lifetime of the object.
struct SingleProcessEnv {
  SingleProcessEnv() {
    setenv("RANK", "0", 1);
    setenv("LOCAL_RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "1", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "29500", 1);  // one process: no store is started
  }
  ~SingleProcessEnv() {
    for (const char* name : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})
      unsetenv(name);
  }
};

amplab::dist::DistConfig cpu_config() {
  amplab::dist::DistConfig c;
  c.backend = amplab::dist::Backend::cpu;
  c.timeout_s = 30;
  return c;
}

// TODO(ddp-1)
TEST(Ddp1_Init, ReadsTheEnvironmentAndUsesTheCpuWhenAsked) {
  SingleProcessEnv env;
  auto setup = ddp_lab::init_distributed(cpu_config(), "cpu");
  EXPECT_EQ(setup.world.world_size, 1);
  EXPECT_EQ(setup.world.rank, 0);
  EXPECT_TRUE(setup.device.is_cpu());
  ASSERT_NE(setup.comm, nullptr);
  EXPECT_EQ(setup.comm->size(), 1);
}

TEST(Ddp1_Init, BadEnvironmentNamesTheVariable) {
  SingleProcessEnv env;
  setenv("WORLD_SIZE", "two", 1);
  EXPECT_TRUE(test::throws_with([] { ddp_lab::init_distributed(cpu_config(), "cpu"); }, {"WORLD_SIZE"}));
}

// TODO(ddp-2)
TEST(Ddp2_Wrap, WrapsTheModelOnItsDevice) {
  SingleProcessEnv env;
  auto setup = ddp_lab::init_distributed(cpu_config(), "cpu");
  auto model = std::make_shared<torch::nn::LinearImpl>(4, 3);
  auto ddp = ddp_lab::wrap_model(model, setup, cpu_config());
  ASSERT_NE(ddp, nullptr);
  EXPECT_EQ(&ddp->module(), model.get());
  // Gradients become views into the all-reduce buckets: a backward and a sync leave them defined.
  model->forward(torch::ones({2, 4})).sum().backward();
  ddp->finish_gradient_sync();
  EXPECT_TRUE(model->weight.grad().defined());
}

// TODO(ddp-3)
TEST(Ddp3_Shard, RanksGetDisjointShardsThatCoverTheData) {
  const int world_size = 3;
  std::vector<torch::Tensor> shards;
  for (int rank = 0; rank < world_size; ++rank) {
    amplab::dist::WorldInfo world;
    world.rank = rank;
    world.world_size = world_size;
    world.local_world_size = world_size;
    auto sampler = ddp_lab::make_sampler(300, 10, /*seed=*/4, world);
    EXPECT_EQ(sampler.batches_per_epoch(), 10);  // 100 samples per rank in batches of 10
    shards.push_back(sampler.order());
  }
  auto all = torch::cat(shards);
  EXPECT_EQ(std::get<0>(at::_unique(all)).size(0), 300);  // disjoint and complete
}

TEST(Ddp3_Shard, SameSeedSameOrderNewEpochNewOrder) {
  amplab::dist::WorldInfo world;
  world.world_size = 2;
  world.local_world_size = 2;
  auto a = ddp_lab::make_sampler(100, 8, 9, world), b = ddp_lab::make_sampler(100, 8, 9, world);
  EXPECT_TRUE(a.order().equal(b.order()));
  auto first = a.order().clone();
  a.set_epoch(1);
  EXPECT_FALSE(a.order().equal(first));
  EXPECT_EQ(a.batches_per_epoch(), 6);  // 50 per rank: 6 full batches, the short one dropped
}

// TODO(ddp-4)
TEST(Ddp4_RankZeroWrites, OnlyRankZeroCreatesTheRunDirectory) {
  test::TempDir dir;
  amplab::RunConfig run;
  run.out_dir = dir.path().string();
  run.log_level = amplab::log::Level::warn;
  amplab::dist::WorldInfo rank1;
  rank1.rank = 1;
  rank1.world_size = 2;
  rank1.local_world_size = 2;
  auto other = ddp_lab::make_run_dir(run, "x: 1\n", rank1);
  EXPECT_FALSE(other.enabled());
  EXPECT_FALSE(std::filesystem::exists(dir.file("ddp")));
  amplab::dist::WorldInfo rank0 = rank1;
  rank0.rank = 0;
  auto main = ddp_lab::make_run_dir(run, "x: 1\n", rank0);
  EXPECT_TRUE(main.enabled());
  EXPECT_TRUE(std::filesystem::exists(main.file("config.yaml")));
  amplab::log::set_rank(0);
  amplab::log::init(amplab::log::Level::info);
}

// A tiny made-up dataset in MNIST's format for the multi-process runs.
std::string write_dataset(const test::TempDir& dir) {
  torch::manual_seed(0);
  for (auto [split, n] : {std::pair{"train", 384}, std::pair{"t10k", 64}}) {
    amplab::IdxArray images, labels;
    images.dims = {n, 28, 28};
    labels.dims = {n};
    auto pixels = torch::randint(0, 256, {n * 28 * 28}, torch::kUInt8);
    images.data.assign(pixels.data_ptr<uint8_t>(), pixels.data_ptr<uint8_t>() + pixels.numel());
    for (int i = 0; i < n; ++i) labels.data.push_back(static_cast<uint8_t>(i % 10));
    dir.write(std::string("data/") + split + "-images-idx3-ubyte", amplab::encode_idx(images, false));
    dir.write(std::string("data/") + split + "-labels-idx1-ubyte", amplab::encode_idx(labels, false));
  }
  return dir.file("data");
}

// All TODOs together: the lab binary on several CPU processes through the launcher.
class Ddp_AllRanks : public ::testing::TestWithParam<int> {};

TEST_P(Ddp_AllRanks, TrainIdenticallyThroughTheLauncher) {
  test::TempDir dir;
  std::string data = write_dataset(dir);
  std::string out;
  int code = test::run({test::binary_dir() + "/bin/amplab-run", "--nproc-per-node", std::to_string(GetParam()), "--",
                        test::binary_dir() + "/bin/" + AMPLAB_LAB_BINARY, "--set", "data.dir=" + data, "--set",
                        "run.out_dir=" + dir.file("runs"), "--set", "run.device=cpu", "--set", "train.batch_size=16",
                        "--set", "train.epochs=2", "--set", "dist.timeout_s=60", "--set", "dist.bucket_mb=0.1"},
                       &out, 300);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("parameters identical on all " + std::to_string(GetParam()) + " rank(s): yes"), std::string::npos)
      << out;
}

INSTANTIATE_TEST_SUITE_P(Ranks, Ddp_AllRanks, ::testing::Values(2, 3));

}  // namespace
