// Distributed training on the CPU: the worker environment, the launcher, the cpu backend's
// collectives and the course's reference DDP (lab 5's solution, ddp_lab::BucketedDdp; the lab's
// graded tests grade a student's, tests/labs/ddp_test.cpp). Multi-process checks start build/bin/amplab-run with build/bin/dist_worker
// as the workers (see dist_worker.cpp for what each scenario checks); each process loads torch,
// about half a second.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>

#include "amplab/infra/config.hpp"
#include "amplab/dist/communicator.hpp"
#include "amplab/dist/world.hpp"
#include "amplab/infra/error.hpp"
#include "amplab/models/models.hpp"
#include "amplab/train/precision.hpp"
#include "data_parallel.hpp"  // lab 5's reference DDP (BucketedDdp)
#include "process.hpp"
#include "support.hpp"

extern char** environ;

namespace amplab {
namespace {

using dist::WorldInfo;

// ------------------------------------------------------------------ running processes

struct Outcome {
  int exit_code = -1;  // the exit code, or 128 + the signal that killed it
  std::string output;  // stdout and stderr, interleaved
  double seconds = 0;
  bool timed_out = false;
};

// amplab-run and dist_worker sit beside this binary (build/bin/).
std::string bin(const std::string& name) {
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() / name).string();
}

// Runs `argv` (no shell) with the test's environment plus `env` ("NAME=value"), minus torchrun's
// variables unless given. `on_output(pid, output so far)` runs whenever output arrives. A process
// still running after `timeout_s` is killed (its workers die with it).
Outcome run(const std::vector<std::string>& argv, const std::vector<std::string>& env = {}, double timeout_s = 60,
            const std::function<void(pid_t, const std::string&)>& on_output = {}) {
  std::vector<std::string> environment;
  for (char** e = environ; *e; ++e) {
    std::string entry = *e, name = entry.substr(0, entry.find('='));
    if (name == "RANK" || name == "WORLD_SIZE" || name == "LOCAL_RANK" || name == "LOCAL_WORLD_SIZE" ||
        name == "MASTER_ADDR" || name == "MASTER_PORT" || name == "GROUP_RANK")
      continue;
    environment.push_back(entry);
  }
  for (const auto& e : env) environment.push_back(e);
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : environment) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  int out[2];
  if (pipe(out) != 0) throw std::runtime_error("pipe");
  auto start = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    dup2(out[1], STDERR_FILENO);
    close(out[0]);
    close(out[1]);
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
  close(out[1]);

  Outcome outcome;
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  for (;;) {
    pollfd p{out[0], POLLIN, 0};
    int left_ms = static_cast<int>((timeout_s - elapsed()) * 1000);
    if (left_ms <= 0) {
      outcome.timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    if (poll(&p, 1, std::min(left_ms, 200)) <= 0) continue;
    char buffer[4096];
    ssize_t n = read(out[0], buffer, sizeof buffer);
    if (n <= 0) break;
    outcome.output.append(buffer, static_cast<size_t>(n));
    if (on_output) on_output(pid, outcome.output);
  }
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  outcome.seconds = elapsed();
  outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return outcome;
}

// amplab-run --nproc-per-node W -- dist_worker <args...>
Outcome launch(int world_size, const std::vector<std::string>& worker_args, double timeout_s = 60,
               const std::function<void(pid_t, const std::string&)>& on_output = {}) {
  std::vector<std::string> argv = {bin("amplab-run"), "--nproc-per-node", std::to_string(world_size), "--",
                                   bin("dist_worker")};
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  return run(argv, {}, timeout_s, on_output);
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The DDP tests here check the reference DDP, lab 5's solution, in detail (its statistics, its
// fast paths). A hand-out has no solution/: this binary links the student's own code, which the
// lab's graded tests grade instead.
#define AMPLAB_REQUIRE_REFERENCE_DDP()                                                              \
  do {                                                                                               \
    if (!std::filesystem::exists(std::filesystem::path(test::source_dir()) / "solution" / "ddp"))   \
      GTEST_SKIP() << "tests the reference DDP (lab 5's solution); a hand-out grades yours in ddp_test"; \
  } while (0)

// Every rank printed "rank R: ok <check>" (prefixed by the launcher).
::testing::AssertionResult all_ranks_ok(const Outcome& o, int world_size, const std::string& check) {
  for (int r = 0; r < world_size; ++r) {
    std::string line = "[rank " + std::to_string(r) + "] rank " + std::to_string(r) + ": ok " + check;
    if (!contains(o.output, line)) return ::testing::AssertionFailure() << "missing \"" << line << "\" in:\n" << o.output;
  }
  return ::testing::AssertionSuccess();
}

// ------------------------------------------------------------------ the worker environment

WorldInfo world_of(const std::map<std::string, std::string>& vars) {
  return dist::world_from_env([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

TEST(World, WithoutWorldSizeItIsASingleProcess) {
  WorldInfo w = world_of({});
  EXPECT_EQ(w.rank, 0);
  EXPECT_EQ(w.world_size, 1);
  EXPECT_FALSE(w.is_distributed());
  EXPECT_TRUE(w.is_main());
  EXPECT_EQ(w.describe(), "single process");
}

TEST(World, ReadsTorchrunsVariables) {
  WorldInfo w = world_of({{"RANK", "5"}, {"LOCAL_RANK", "1"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "4"},
                          {"GROUP_RANK", "1"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "1234"}});
  EXPECT_EQ(w.rank, 5);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.world_size, 8);
  EXPECT_EQ(w.local_world_size, 4);
  EXPECT_EQ(w.group_rank, 1);
  EXPECT_EQ(w.master_addr, "node0");
  EXPECT_EQ(w.master_port, 1234);
  EXPECT_TRUE(w.is_distributed());
  EXPECT_FALSE(w.is_main());
  EXPECT_EQ(w.describe(), "rank 5 of 8 (local 1 of 4, node 1), store node0:1234");

  WorldInfo defaults = world_of({{"RANK", "3"}, {"LOCAL_RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}});
  EXPECT_EQ(defaults.group_rank, 1);  // RANK / LOCAL_WORLD_SIZE
  EXPECT_EQ(defaults.master_addr, "127.0.0.1");
  EXPECT_EQ(defaults.master_port, 29500);
}

TEST(World, BadOrMissingVariablesNameTheVariableAndItsRange) {
  std::map<std::string, std::string> good = {{"RANK", "1"}, {"LOCAL_RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "2"}};
  auto with = [&](const std::string& name, const char* value) {
    auto vars = good;
    if (value) vars[name] = value;
    else vars.erase(name);
    return [vars] { world_of(vars); };
  };
  EXPECT_TRUE(test::throws_with(with("RANK", "2"), {"RANK='2'", "[0, 1]", "WORLD_SIZE=2", "amplab-run"}));
  EXPECT_TRUE(test::throws_with(with("RANK", "one"), {"RANK='one'", "integer"}));
  EXPECT_TRUE(test::throws_with(with("RANK", nullptr), {"RANK is not set", "WORLD_SIZE"}));
  EXPECT_TRUE(test::throws_with(with("LOCAL_RANK", nullptr), {"LOCAL_RANK is not set"}));
  EXPECT_TRUE(test::throws_with(with("LOCAL_WORLD_SIZE", "3"), {"LOCAL_WORLD_SIZE='3'", "[1, 2]"}));
  EXPECT_TRUE(test::throws_with(with("WORLD_SIZE", "0"), {"WORLD_SIZE='0'", "[1, "}));
  EXPECT_TRUE(test::throws_with(with("MASTER_PORT", "70000"), {"MASTER_PORT='70000'", "[1, 65535]"}));
  EXPECT_TRUE(test::throws_with(with("MASTER_ADDR", ""), {"MASTER_ADDR is empty"}));
  EXPECT_TRUE(test::throws_with([] { world_of({{"RANK", "0"}}); }, {"RANK is set but WORLD_SIZE is not"}));
}

TEST(DistConfig, YamlKeysDefaultsAndErrors) {
  dist::DistConfig config;
  ConfigSource::parse("backend: cpu\nbucket_mb: 0.5\noverlap: false\nstep_each_bucket: false\ncompression: bf16\n", "dist.yaml")
      .bind(config);
  EXPECT_EQ(config.backend, dist::Backend::cpu);
  EXPECT_EQ(config.bucket_mb, 0.5);
  EXPECT_FALSE(config.overlap);
  EXPECT_FALSE(config.step_each_bucket);
  EXPECT_TRUE(config.broadcast_buffers);
  EXPECT_TRUE(config.nccl_high_priority);
  EXPECT_EQ(config.timeout_s, 300);
  EXPECT_EQ(config.compression, dist::Compression::bf16);
  EXPECT_EQ(dist::DistConfig{}.compression, dist::Compression::none);  // PyTorch's default: exact fp32 averages
  dist::DistConfig bad;
  EXPECT_TRUE(test::throws_with([&] { ConfigSource::parse("backend: gloo\n", "dist.yaml").bind(bad); },
                                {"dist.yaml", "backend", "gloo", "auto", "nccl", "cpu"}));
  EXPECT_TRUE(test::throws_with([&] { ConfigSource::parse("timeout_s: 0\n", "dist.yaml").bind(bad); },
                                {"timeout_s", "> 0"}));
  EXPECT_TRUE(test::throws_with([&] { ConfigSource::parse("compression: fp8\n", "dist.yaml").bind(bad); },
                                {"dist.yaml", "compression", "fp8", "none", "bf16"}));
}

TEST(DistConfig, BackendResolution) {
  WorldInfo two = world_of({{"RANK", "0"}, {"LOCAL_RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "2"}});
  dist::DistConfig config;
  EXPECT_EQ(dist::resolve_backend(WorldInfo{}, config, torch::kCPU), "single");
  EXPECT_EQ(dist::resolve_backend(two, config, torch::kCPU), "cpu");
  EXPECT_EQ(dist::resolve_backend(two, config, torch::Device("cuda:0")), "nccl");
  config.backend = dist::Backend::nccl;
  EXPECT_TRUE(test::throws_with([&] { dist::resolve_backend(two, config, torch::kCPU); },
                                {"dist.backend=nccl needs a GPU", "dist.backend=cpu"}));
  config.backend = dist::Backend::cpu;
  EXPECT_TRUE(test::throws_with([&] { dist::resolve_backend(two, config, torch::Device("cuda:0")); },
                                {"dist.backend=cpu", "CPU tensors"}));
}

// ------------------------------------------------------------------ DDP in one process

struct TwoLayers : torch::nn::Module {
  TwoLayers() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 16));   // 384 + 64 bytes
    fc2 = register_module("fc2", torch::nn::Linear(16, 16));  // 1024 + 64 bytes
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

// World size 1 ("single" backend): DDP must be plain training, bit for bit, with the buckets
// laid out last layer first and split at the cap.
TEST(Ddp, SingleProcessIsPlainTrainingAndBucketsFollowReverseOrder) {
  AMPLAB_REQUIRE_REFERENCE_DDP();
  auto comm = dist::make_communicator(WorldInfo{}, {}, torch::kCPU);
  EXPECT_EQ(comm->backend(), "single");
  torch::manual_seed(0);
  auto model = std::make_shared<TwoLayers>();
  auto plain = std::make_shared<TwoLayers>();
  for (size_t i = 0; i < model->parameters().size(); ++i)
    plain->parameters()[i].detach().copy_(model->parameters()[i].detach());

  dist::DistConfig config;
  config.bucket_mb = 512.0 / (1024 * 1024);
  ddp_lab::BucketedDdp ddp(model, comm, config);
  using Names = std::vector<std::vector<std::string>>;
  // PyTorch's assignment: fc2.weight (1 KiB) closes the first bucket; both of fc2's parameters
  // are reduced in their own .grad, fc1's two share the second bucket's flat buffer.
  EXPECT_EQ(ddp.bucket_layout(), (Names{{"fc2.bias", "fc2.weight"}, {"fc1.bias", "fc1.weight"}}));
  EXPECT_EQ(ddp.parameters_sharing_a_buffer(), (std::vector<std::string>{"fc1.weight", "fc1.bias"}));

  torch::optim::SGD a(model->parameters(), 0.1), b(plain->parameters(), 0.1);
  for (int step = 0; step < 3; ++step) {
    auto x = torch::randn({8, 6}), y = torch::randn({8, 16});
    a.zero_grad(step % 2 == 0);  // both ways of zeroing
    b.zero_grad();
    {
      auto local = ddp.no_sync();  // accumulation: half the batch locally...
      torch::mse_loss(model->forward(x.narrow(0, 0, 4)), y.narrow(0, 0, 4)).div(2).backward();
    }
    torch::mse_loss(model->forward(x.narrow(0, 4, 4)), y.narrow(0, 4, 4)).div(2).backward();  // ...half synced
    ddp.finish_gradient_sync();
    torch::mse_loss(plain->forward(x.narrow(0, 0, 4)), y.narrow(0, 0, 4)).div(2).backward();
    torch::mse_loss(plain->forward(x.narrow(0, 4, 4)), y.narrow(0, 4, 4)).div(2).backward();
    a.step();
    b.step();
    for (size_t i = 0; i < model->parameters().size(); ++i) {
      EXPECT_TRUE(test::tensors_equal(model->parameters()[i].grad(), plain->parameters()[i].grad()));
      EXPECT_TRUE(test::tensors_equal(model->parameters()[i], plain->parameters()[i]));
    }
  }
  EXPECT_EQ(ddp.stats().syncs, 3);
  EXPECT_EQ(ddp.stats().buckets_during_backward, 3 * 2);
  // Steps 0 and 2 reset .grad to none: one copy per parameter of the shared buffer; fc2's
  // parameters are reduced in their own .grad.
  EXPECT_EQ(ddp.stats().grad_copies, 2 * 2);
}

// Records "compute <k>" when autograd starts the backward node it is attached to.
struct RecordStart final : torch::autograd::FunctionPreHook {
  RecordStart(std::vector<std::string>& events, std::string what) : events(events), what(std::move(what)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    events.push_back(what);
    return grads;
  }
  std::vector<std::string>& events;
  std::string what;
};

// A first layer in pieces (models.hpp) is the same layer as the Linear it was cut from, and in
// backward each piece's weight gradient is finished before the next piece's is started: what lets
// DDP all-reduce one piece while the next one is computed. DDP gives each piece a bucket.
TEST(Ddp, LinearInPiecesIsTheSameLayerAndFinishesEachPieceBeforeTheNext) {
  AMPLAB_REQUIRE_REFERENCE_DDP();
  torch::manual_seed(0);
  torch::nn::Linear whole(6, 10);
  LinearInPieces split(6, 10, 4);
  split->copy_from(whole);
  std::vector<int64_t> rows;
  for (auto& piece : split->pieces) rows.push_back(piece->weight.size(0));
  EXPECT_EQ(rows, (std::vector<int64_t>{3, 3, 2, 2}));

  auto x = torch::randn({5, 6}), target = torch::randn({5, 10});
  auto expected = whole(x);
  torch::mse_loss(expected, target).backward();
  std::vector<std::string> events;
  for (size_t k = 0; k < split->pieces.size(); ++k)
    split->pieces[k]->weight.register_hook([&events, k](torch::Tensor) { events.push_back("gradient " + std::to_string(k)); });
  // Forward, then backward recording when each piece's gradient is started and finished.
  auto forward_backward = [&](Precision precision) {
    events.clear();
    torch::Tensor out;
    {
      AutocastGuard autocast(torch::kCPU, precision);
      out = split(x);
    }
    const auto& cat = out.grad_fn();  // the join of the pieces: its inputs are the pieces' outputs, in order
    for (size_t k = 0; k < cat->next_edges().size(); ++k)
      cat->next_edges()[k].function->add_pre_hook(std::make_unique<RecordStart>(events, "compute " + std::to_string(k)));
    torch::mse_loss(out.to(torch::kFloat32), target).backward();
    return out;
  };
  const std::vector<std::string> piece_by_piece = {"compute 3", "gradient 3", "compute 2", "gradient 2",
                                                   "compute 1", "gradient 1", "compute 0", "gradient 0"};
  // Under bf16 autocast (the benchmark's precision) each piece's weight is cast on the way in.
  forward_backward(Precision::bf16_mixed);
  EXPECT_EQ(events, piece_by_piece);
  split->zero_grad();
  auto out = forward_backward(Precision::fp32);
  EXPECT_EQ(events, piece_by_piece);

  EXPECT_TRUE(torch::allclose(out, expected, 1e-6, 1e-7));
  auto grads_of = [](const std::vector<torch::nn::Linear>& pieces, bool weight) {
    std::vector<torch::Tensor> g;
    for (const auto& piece : pieces) g.push_back((weight ? piece->weight : piece->bias).grad());
    return torch::cat(g);
  };
  EXPECT_TRUE(torch::allclose(grads_of(split->pieces, true), whole->weight.grad(), 1e-6, 1e-7));
  EXPECT_TRUE(torch::allclose(grads_of(split->pieces, false), whole->bias.grad(), 1e-6, 1e-7));

  EXPECT_THROW(LinearInPieces(6, 10, 11), Error);
  EXPECT_THROW(LinearInPieces(6, 10, 0), Error);
  EXPECT_THROW(split->copy_from(torch::nn::Linear(6, 9)), Error);

  // In the benchmark's MLP each piece of the first layer closes a bucket of its own (here a
  // piece's weight is 64 bytes), launched from its hook during backward.
  auto mlp = make_mlp(8, 2, /*first_layer_pieces=*/4);
  dist::DistConfig config;
  config.bucket_mb = 64.0 / (1024 * 1024);
  ddp_lab::BucketedDdp ddp(mlp.ptr(), dist::make_communicator(WorldInfo{}, {}, torch::kCPU), config);
  using Names = std::vector<std::vector<std::string>>;
  EXPECT_EQ(ddp.bucket_layout(), (Names{{"2.bias", "2.weight"},
                                        {"0.piece3.bias", "0.piece3.weight"},
                                        {"0.piece2.bias", "0.piece2.weight"},
                                        {"0.piece1.bias", "0.piece1.weight"},
                                        {"0.piece0.bias", "0.piece0.weight"}}));
  mlp->forward(torch::randn({3, 8})).sum().backward();
  ddp.finish_gradient_sync();
  EXPECT_EQ(ddp.stats().buckets_during_backward, 5);
}

// Under autocast a Linear casts its input to the autocast dtype; in pieces that cast is done once
// and shared (one copy of the input, not one per piece), and the output is still the Linear's.
TEST(Ddp, LinearInPiecesCastsItsInputOnceUnderAutocast) {
  torch::manual_seed(0);
  torch::nn::Linear whole(6, 10);
  LinearInPieces split(6, 10, 4);
  split->copy_from(whole);
  // Not a leaf: autocast caches the casts of leaves that require grad (weights), never of others.
  auto x = torch::randn({5, 6}, torch::requires_grad()) * 1.0;
  torch::Tensor out, expected;
  {
    AutocastGuard autocast(torch::kCPU, Precision::bf16_mixed);
    out = split(x);
    expected = whole(x);
  }
  EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::allclose(out.to(torch::kFloat32), expected.to(torch::kFloat32), 1e-2, 1e-2));
  // The nodes every piece's linear reads from: only the input's cast can be common to all.
  std::vector<torch::autograd::Node*> shared;
  const auto& cat = out.grad_fn();
  for (size_t k = 0; k < cat->next_edges().size(); ++k) {
    std::vector<torch::autograd::Node*> inputs;
    for (const auto& edge : cat->next_edges()[k].function->next_edges())
      if (edge.function) inputs.push_back(edge.function.get());
    if (k == 0) {
      shared = inputs;
      continue;
    }
    std::erase_if(shared, [&](torch::autograd::Node* node) { return std::ranges::find(inputs, node) == inputs.end(); });
  }
  ASSERT_EQ(shared.size(), 1u) << "each piece casts the input itself";
  EXPECT_NE(shared[0]->name().find("ToCopy"), std::string::npos) << shared[0]->name();
}

TEST(Collectives, ThenCopyConvertsOnceTheWorkIsDoneAndRefusesUnpairedLists) {
  auto comm = dist::make_communicator(WorldInfo{}, {}, torch::kCPU);
  auto from = torch::tensor({1.5f, -2.25f}).to(torch::kBFloat16);
  auto to = torch::zeros({2});
  comm->then_copy(comm->all_reduce_mean({from}), {from}, {to})->wait();
  EXPECT_TRUE(test::tensors_equal(to, torch::tensor({1.5f, -2.25f})));
  EXPECT_TRUE(test::throws_with([&] { comm->then_copy(comm->all_reduce_sum({from}), {from}, {}); },
                                {"then_copy", "one destination per source", "1 source(s) and 0 destination(s)"}));
}

TEST(Collectives, OneRankReduceScatterAndAllGatherAreCopiesAndBadSizesAreRefused) {
  auto comm = dist::make_communicator(WorldInfo{}, {}, torch::kCPU);
  auto input = torch::tensor({1.f, 2.f, 3.f});
  auto output = torch::zeros({3});
  comm->reduce_scatter(output, input, dist::Reduction::mean)->wait();
  EXPECT_TRUE(test::tensors_equal(output, input));
  auto gathered = torch::zeros({3});
  comm->all_gather(gathered, input)->wait();
  EXPECT_TRUE(test::tensors_equal(gathered, input));
  comm->all_gather(gathered, gathered)->wait();  // in place: the whole is the part
  EXPECT_TRUE(test::tensors_equal(gathered, input));
  EXPECT_TRUE(test::throws_with([&] { comm->reduce_scatter(torch::zeros({2}), input); },
                                {"reduce_scatter (rank 0)", "3 elements", "world size 1 x the shard's 2",
                                 "shard_numel"}));
  EXPECT_TRUE(test::throws_with([&] { comm->all_gather(gathered, input.to(torch::kFloat64)); },
                                {"all_gather (rank 0)", "Float and Double", "one dtype"}));
  EXPECT_TRUE(test::throws_with([&] { comm->reduce_scatter(torch::zeros({3}, torch::kInt64), torch::ones({3}, torch::kInt64), dist::Reduction::mean); },
                                {"a mean of Long tensors", "Reduction::sum"}));
  EXPECT_EQ(dist::shard_numel(10, 4), 3);
  EXPECT_EQ(dist::shard_numel(12, 4), 3);
  EXPECT_EQ(dist::shard_numel(0, 4), 0);
}

TEST(Ddp, RefusesToWrapTwice) {
  AMPLAB_REQUIRE_REFERENCE_DDP();
  auto comm = dist::make_communicator(WorldInfo{}, {}, torch::kCPU);
  auto model = std::make_shared<TwoLayers>();
  ddp_lab::BucketedDdp first(model, comm);
  EXPECT_TRUE(test::throws_with([&] { ddp_lab::BucketedDdp second(model, comm); },
                                {"fc1.weight", "already has a post-accumulate-grad hook"}));
}

// A weight registered under two names (tied embeddings) is one parameter: one slot, one hook.
TEST(Ddp, TiedWeightsAreSynchronizedOnce) {
  AMPLAB_REQUIRE_REFERENCE_DDP();
  struct Tied : torch::nn::Module {
    Tied() {
      w = register_parameter("w", torch::randn({4, 4}));
      register_parameter("w_again", w);
    }
    torch::Tensor w;
  };
  auto comm = dist::make_communicator(WorldInfo{}, {}, torch::kCPU);
  auto model = std::make_shared<Tied>();
  ddp_lab::BucketedDdp ddp(model, comm);
  using Names = std::vector<std::vector<std::string>>;
  EXPECT_EQ(ddp.bucket_layout(), (Names{{"w"}}));
  (model->w * 2).sum().backward();
  ddp.finish_gradient_sync();
  EXPECT_TRUE(test::tensors_equal(model->w.grad(), torch::full({4, 4}, 2.0f)));
}

// ------------------------------------------------------------------ the launcher

TEST(Launcher, BadCommandLinesGiveOneLineErrors) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  std::vector<Case> cases = {
      {{}, "no worker command"},
      {{"--nproc-per-node", "0", "--", "true"}, "--nproc-per-node"},
      {{"--nproc-per-node", "two", "--", "true"}, "--nproc-per-node"},
      {{"--nnodes", "2", "--node-rank", "2", "--master-addr", "h", "--", "true"}, "--node-rank 2 is not in [0, 2)"},
      {{"--nnodes", "2", "--node-rank", "1", "--", "true"}, "needs --master-addr"},
      {{"--standalone", "--nnodes", "2", "--master-addr", "h", "--", "true"}, "--standalone runs one node"},
      {{"--standalone", "--master-port", "1234", "--", "true"}, "--standalone picks"},
      {{"--master-port", "99999", "--", "true"}, "--master-port"},
      {{"--frobnicate", "--", "true"}, "--frobnicate"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> argv = {bin("amplab-run")};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    Outcome o = run(argv, {}, 10);
    EXPECT_EQ(o.exit_code, 2) << o.output;
    EXPECT_TRUE(contains(o.output, "amplab-run: ")) << o.output;
    EXPECT_TRUE(contains(o.output, c.message)) << "expected \"" << c.message << "\" in: " << o.output;
    EXPECT_EQ(std::count(o.output.begin(), o.output.end(), '\n'), 1) << o.output;
  }
  Outcome missing = run({bin("amplab-run"), "--", "/nonexistent/worker"}, {}, 10);
  EXPECT_EQ(missing.exit_code, 127) << missing.output;
  EXPECT_TRUE(contains(missing.output, "cannot start '/nonexistent/worker'")) << missing.output;
}

TEST(Launcher, SetsTorchrunsEnvironmentAndPrefixesEachLine) {
  Outcome o = run({bin("amplab-run"), "--nproc-per-node", "2", "--", "env"},
                  {"NCCL_DEBUG=WARN", "TORCHELASTIC_RUN_ID=stale", "RANK=99"}, 20);
  ASSERT_EQ(o.exit_code, 0) << o.output;
  for (int r = 0; r < 2; ++r) {
    std::string p = "[rank " + std::to_string(r) + "] ";
    EXPECT_TRUE(contains(o.output, p + "RANK=" + std::to_string(r) + "\n")) << o.output;
    EXPECT_TRUE(contains(o.output, p + "LOCAL_RANK=" + std::to_string(r) + "\n")) << o.output;
    EXPECT_TRUE(contains(o.output, p + "WORLD_SIZE=2\n")) << o.output;
    EXPECT_TRUE(contains(o.output, p + "LOCAL_WORLD_SIZE=2\n")) << o.output;
    EXPECT_TRUE(contains(o.output, p + "GROUP_RANK=0\n")) << o.output;
    EXPECT_TRUE(contains(o.output, p + "MASTER_ADDR=127.0.0.1\n")) << o.output;
    EXPECT_TRUE(contains(o.output, p + "MASTER_PORT=")) << o.output;
    EXPECT_TRUE(contains(o.output, p + "NCCL_DEBUG=WARN\n")) << o.output;  // the user's NCCL_* pass through
    EXPECT_TRUE(contains(o.output, p + "OMP_NUM_THREADS=1\n")) << o.output;
  }
  EXPECT_FALSE(contains(o.output, "TORCHELASTIC_RUN_ID")) << o.output;
  EXPECT_FALSE(contains(o.output, "RANK=99")) << o.output;
  // No line escapes its prefix (stderr lines come from the launcher itself).
  std::istringstream lines(o.output);
  for (std::string line; std::getline(lines, line);)
    EXPECT_TRUE(line.rfind("[rank ", 0) == 0 || line.rfind("amplab-run: ", 0) == 0) << line;
}

TEST(Launcher, ForwardsSigintToEveryWorker) {
  bool sent = false;
  Outcome o = launch(2, {"sigint"}, 60, [&](pid_t launcher, const std::string& output) {
    if (!sent && contains(output, "rank 0: ready") && contains(output, "rank 1: ready")) {
      kill(launcher, SIGINT);  // the launcher only: it must pass it on
      sent = true;
    }
  });
  ASSERT_TRUE(sent) << o.output;
  EXPECT_TRUE(contains(o.output, "[rank 0] rank 0: caught SIGINT")) << o.output;
  EXPECT_TRUE(contains(o.output, "[rank 1] rank 1: caught SIGINT")) << o.output;
  EXPECT_EQ(o.exit_code, 128 + SIGINT) << o.output;
  EXPECT_TRUE(contains(o.output, "amplab-run: stopped after SIGINT")) << o.output;
}

TEST(Launcher, AKilledRankStopsTheOthersPromptly) {
  Outcome o = launch(2, {"die"}, 60);
  EXPECT_FALSE(o.timed_out) << o.output;
  EXPECT_EQ(o.exit_code, 128 + SIGKILL) << o.output;
  EXPECT_TRUE(contains(o.output, "amplab-run: rank 1 (local rank 1, pid ")) << o.output;
  EXPECT_TRUE(contains(o.output, "was killed by SIGKILL; stopped the other ranks (0)")) << o.output;
  // Rank 0 sat in an all-reduce with a 120 s timeout: the launcher ended it, not the timeout.
  EXPECT_LT(o.seconds, 20) << o.output;
}

TEST(Launcher, ARankThatLeftStopsTheOthersWaitingForItAtOnce) {
  // Rank 1 shuts its communicator down cleanly and exits 0; rank 0 waits in an all-reduce with a
  // 120 s timeout. A clean leave is no death (no heartbeat goes silent), yet the all-reduce can
  // never complete: rank 0 must fail now, naming rank 1.
  Outcome o = launch(2, {"leave", "1", "120"}, 60);
  EXPECT_FALSE(o.timed_out) << o.output;
  EXPECT_NE(o.exit_code, 0) << o.output;
  EXPECT_TRUE(contains(o.output, "rank 1: left")) << o.output;
  EXPECT_TRUE(contains(o.output, "rank 1 left the process group without taking part")) << o.output;
  EXPECT_LT(o.seconds, 20) << o.output;
}

// ------------------------------------------------------------------ collectives and DDP, multi-process

TEST(Collectives, WorldSize2) {
  Outcome o = launch(2, {"collectives"});
  ASSERT_EQ(o.exit_code, 0) << o.output;
  for (const char* check : {"all-reduce", "broadcast", "reduce-scatter and all-gather", "all-gather and barrier", "metric helpers", "store cleanup"})
    EXPECT_TRUE(all_ranks_ok(o, 2, check));
}

TEST(Collectives, WorldSize3) {
  Outcome o = launch(3, {"collectives"});
  ASSERT_EQ(o.exit_code, 0) << o.output;
  for (const char* check : {"all-reduce", "broadcast", "reduce-scatter and all-gather", "all-gather and barrier", "metric helpers", "store cleanup"})
    EXPECT_TRUE(all_ranks_ok(o, 3, check));
}

TEST(Collectives, WorldSize4) {
  Outcome o = launch(4, {"collectives"});
  ASSERT_EQ(o.exit_code, 0) << o.output;
  for (const char* check : {"all-reduce", "broadcast", "reduce-scatter and all-gather", "all-gather and barrier", "metric helpers", "store cleanup"})
    EXPECT_TRUE(all_ranks_ok(o, 4, check));
}

TEST(Ddp, MatchesOneProcessWithTheWholeBatchWorldSize2) {
  AMPLAB_REQUIRE_REFERENCE_DDP();
  Outcome o = launch(2, {"ddp"});
  ASSERT_EQ(o.exit_code, 0) << o.output;
  EXPECT_TRUE(all_ranks_ok(o, 2, "DDP matches one process with the whole batch (world 2)"));
  EXPECT_TRUE(all_ranks_ok(o, 2, "overlap off = overlap on"));
  EXPECT_TRUE(all_ranks_ok(o, 2, "set_to_none = zero in place"));
}

TEST(Ddp, MatchesOneProcessWithTheWholeBatchWorldSize3) {
  AMPLAB_REQUIRE_REFERENCE_DDP();
  Outcome o = launch(3, {"ddp"});
  ASSERT_EQ(o.exit_code, 0) << o.output;
  EXPECT_TRUE(all_ranks_ok(o, 3, "DDP matches one process with the whole batch (world 3)"));
  EXPECT_TRUE(all_ranks_ok(o, 3, "overlap off = overlap on"));
}

TEST(Ddp, AccumulationUnderNoSyncEqualsSyncingEveryMicroStep) {
  AMPLAB_REQUIRE_REFERENCE_DDP();
  Outcome o = launch(2, {"accumulate"});
  ASSERT_EQ(o.exit_code, 0) << o.output;
  EXPECT_TRUE(all_ranks_ok(o, 2, "accumulation with no_sync = without"));
}

// With a fused optimizer the trainer updates each bucket as soon as it is reduced (3 ranks: the
// average is not a power of two): same parameters, to the bit, as one step after all buckets.
TEST(Ddp, TrainerStepsEachBucketAsItArrivesWithTheSameResult) {
  AMPLAB_REQUIRE_REFERENCE_DDP();
  Outcome o = launch(3, {"step_each_bucket"});
  ASSERT_EQ(o.exit_code, 0) << o.output;
  for (const char* optimizer : {"sgd", "adamw"})
    EXPECT_TRUE(all_ranks_ok(o, 3, std::string("fused ") + optimizer + ": each bucket stepped as soon as it is reduced = one step after all"));
}

TEST(Ddp, UnusedParametersAndTheOneBackwardRule) {
  AMPLAB_REQUIRE_REFERENCE_DDP();
  Outcome o = launch(2, {"unused"});
  ASSERT_EQ(o.exit_code, 0) << o.output;
  EXPECT_TRUE(all_ranks_ok(o, 2, "a parameter unused on some ranks"));
  EXPECT_TRUE(all_ranks_ok(o, 2, "a parameter unused on all ranks"));
  EXPECT_TRUE(all_ranks_ok(o, 2, "one backward per step is enforced"));
  EXPECT_TRUE(contains(o.output, "[rank 1] ")) << o.output;
  EXPECT_TRUE(contains(o.output, "got no gradient on rank 1")) << o.output;  // the warning, once
}

// dist.compression=bf16 leaves in .grad exactly what PyTorch's bf16_compress_hook gives (on two
// ranks, against a fixture recorded from PyTorch's DDP itself), whether
// DDP takes a gradient before autocast's cast to fp32 or rounds an fp32 one (3 ranks: the average
// is not a power of two, so DDP divides before the sum, as the hook does).
TEST(Ddp, Bf16CompressionGivesTheResultOfPyTorchsBf16CompressHook) {
  AMPLAB_REQUIRE_REFERENCE_DDP();
  for (int world : {2, 3}) {
    Outcome o = launch(world, {"compress"});
    ASSERT_EQ(o.exit_code, 0) << o.output;
    EXPECT_TRUE(all_ranks_ok(o, world, "bf16 compression under bf16 autocast = PyTorch's bf16_compress_hook"));
    EXPECT_TRUE(all_ranks_ok(o, world, "bf16 compression of fp32 and of accumulated gradients = PyTorch's bf16_compress_hook"));
    if (world == 2) {  // the PyTorch fixture was recorded on two ranks
      EXPECT_TRUE(all_ranks_ok(o, 2, "bf16 compression = PyTorch's DDP with bf16_compress_hook, bit for bit"));
    }
  }
}

TEST(Ddp, DifferentModelsOnTheRanksFailWithAClearError) {
  AMPLAB_REQUIRE_REFERENCE_DDP();
  Outcome o = launch(2, {"mismatch"}, 60);
  EXPECT_EQ(o.exit_code, 2) << o.output;
  std::string message =
      "DDP: the model differs across ranks (every rank must build the same model, with the same dist.bucket_mb): at "
      "entry 1, rank 0 has parameter 'fc.weight' Float [5, 8] but rank 1 has parameter 'fc.weight' Float [4, 8]";
  // Both ranks detect it, but the first to exit makes the launcher stop the other, which may
  // not have printed yet.
  EXPECT_TRUE(contains(o.output, "[rank 0] error: " + message) || contains(o.output, "[rank 1] error: " + message))
      << o.output;
  EXPECT_TRUE(contains(o.output, "amplab-run: rank ")) << o.output;
  EXPECT_TRUE(contains(o.output, "exited with code 2")) << o.output;
}

// The same scenarios on two GPUs over NCCL (skipped where there are fewer).
TEST(Nccl, CollectivesAndDdpOnTwoGpus_CUDA) {
  AMPLAB_REQUIRE_REFERENCE_DDP();
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  Outcome collectives = launch(2, {"collectives", "--nccl"}, 120);
  ASSERT_EQ(collectives.exit_code, 0) << collectives.output;
  for (const char* check : {"all-reduce", "broadcast", "reduce-scatter and all-gather", "all-gather and barrier", "metric helpers", "store cleanup"})
    EXPECT_TRUE(all_ranks_ok(collectives, 2, check));
  Outcome ddp = launch(2, {"ddp", "--nccl"}, 120);
  ASSERT_EQ(ddp.exit_code, 0) << ddp.output;
  EXPECT_TRUE(all_ranks_ok(ddp, 2, "DDP matches one process with the whole batch (world 2)"));
  EXPECT_TRUE(all_ranks_ok(ddp, 2, "overlap off = overlap on"));
  EXPECT_TRUE(all_ranks_ok(ddp, 2, "set_to_none = zero in place"));
  Outcome accumulate = launch(2, {"accumulate", "--nccl"}, 120);
  ASSERT_EQ(accumulate.exit_code, 0) << accumulate.output;
  EXPECT_TRUE(all_ranks_ok(accumulate, 2, "accumulation with no_sync = without"));
  Outcome each = launch(2, {"step_each_bucket", "--nccl"}, 120);
  ASSERT_EQ(each.exit_code, 0) << each.output;
  EXPECT_TRUE(all_ranks_ok(each, 2, "fused adamw: each bucket stepped as soon as it is reduced = one step after all"));
  Outcome unused = launch(2, {"unused", "--nccl"}, 120);
  ASSERT_EQ(unused.exit_code, 0) << unused.output;
  EXPECT_TRUE(all_ranks_ok(unused, 2, "a parameter unused on all ranks"));
  Outcome compress = launch(2, {"compress", "--nccl"}, 120);
  ASSERT_EQ(compress.exit_code, 0) << compress.output;
  EXPECT_TRUE(all_ranks_ok(compress, 2, "bf16 compression = PyTorch's DDP with bf16_compress_hook, bit for bit"));
  EXPECT_TRUE(all_ranks_ok(compress, 2, "bf16 compression under bf16 autocast = PyTorch's bf16_compress_hook"));
  EXPECT_TRUE(all_ranks_ok(compress, 2, "bf16 compression of fp32 and of accumulated gradients = PyTorch's bf16_compress_hook"));
  Outcome mismatch = launch(2, {"mismatch", "--nccl"}, 120);
  EXPECT_EQ(mismatch.exit_code, 2) << mismatch.output;
  EXPECT_TRUE(contains(mismatch.output, "DDP: the model differs across ranks")) << mismatch.output;
}

// ------------------------------------------------------------------ ranks that never arrive

std::vector<std::string> lone_rank_env(int rank) {
  return {"RANK=" + std::to_string(rank), "LOCAL_RANK=" + std::to_string(rank), "WORLD_SIZE=2",
          "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(test::free_port())};
}

TEST(Rendezvous, RankZeroNamesTheRankThatNeverArrived) {
  Outcome o = run({bin("dist_worker"), "join", "2"}, lone_rank_env(0), 30);
  EXPECT_EQ(o.exit_code, 2) << o.output;
  EXPECT_TRUE(contains(o.output, "error: joining the process group (rendezvous at 127.0.0.1:")) << o.output;
  EXPECT_TRUE(contains(o.output, "rank 0 timed out after 2 s waiting for rank 1 (of 2)")) << o.output;
  EXPECT_TRUE(contains(o.output, "MASTER_PORT")) << o.output;
  EXPECT_LT(o.seconds, 10) << o.output;
}

TEST(Rendezvous, AnotherRankFailsWhenRankZeroNeverArrives) {
  Outcome o = run({bin("dist_worker"), "join", "2"}, lone_rank_env(1), 30);
  EXPECT_EQ(o.exit_code, 2) << o.output;
  EXPECT_TRUE(contains(o.output, "error: rank 1 could not reach the rendezvous store at 127.0.0.1:")) << o.output;
  EXPECT_TRUE(contains(o.output, "(hosted by rank 0) within 2 s")) << o.output;
  EXPECT_LT(o.seconds, 10) << o.output;
}

}  // namespace
}  // namespace amplab
