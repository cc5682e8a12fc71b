// Graded tests of lab 8 (labs/sharded_training/rubric.yaml gives each its TODO and points). The multi-rank
// tests run each rank on a thread of this process over the cpu backend, whose sums repeat to the
// bit; they compare against torch's own AdamW on one process with the whole batch.
#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <string_view>

#include "amplab/dist/forwarding_communicator.hpp"
#include "ranks.hpp"  // on_rank_threads
#include "support.hpp"
#include "amplab/state/safetensors.hpp"
#include "sharded_training.hpp"

namespace {
namespace test = amplab::test;
namespace dist = amplab::dist;

dist::DistConfig cpu_config() {
  dist::DistConfig c;
  c.backend = dist::Backend::cpu;
  c.timeout_s = 20;  // a rank that failed leaves the others waiting at most this long
  return c;
}

// Runs body(communicator) on `world_size` threads, each a rank of one job on the cpu backend.
// Returns each rank's error message ("" where it finished).
std::vector<std::string> run_ranks(int world_size, const std::function<void(std::shared_ptr<dist::Communicator>)>& body) {
  at::set_num_threads(1);
  return test::on_rank_threads(world_size, [&](const dist::WorldInfo& world) {
    auto comm = dist::make_communicator(world, cpu_config(), torch::kCPU);
    body(comm);
    comm->shutdown();
  });
}

::testing::AssertionResult all_ranks_finished(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r)
    if (!errors[r].empty()) return ::testing::AssertionFailure() << "rank " << r << ": " << errors[r];
  return ::testing::AssertionSuccess();
}

std::vector<torch::Tensor> shaped(std::initializer_list<std::vector<int64_t>> shapes) {
  std::vector<torch::Tensor> params;
  for (const auto& s : shapes) params.push_back(torch::zeros(s));
  return params;
}

// ---------------------------------------------------------------- TODO(sharded_training-1): the flat layout

TEST(ShardedTraining1_Layout, ParametersLieBackToBackInTheirOrder) {
  const auto layout = zero_lab::flat_layout(shaped({{2, 3}, {4}, {1, 1, 5}}), 1);
  EXPECT_EQ(layout.offsets, (std::vector<int64_t>{0, 6, 10}));
  EXPECT_EQ(layout.numel, 15);
  EXPECT_EQ(layout.shard_numel, 15);
  EXPECT_EQ(layout.world_size, 1);
}

TEST(ShardedTraining1_Layout, EqualShardsCoverEveryElement) {
  const auto params = shaped({{2, 3}, {4}, {1, 1, 5}});  // 15 elements
  for (auto [world, shard] : std::vector<std::pair<int, int64_t>>{{2, 8}, {3, 5}, {4, 4}, {16, 1}}) {
    const auto layout = zero_lab::flat_layout(params, world);
    EXPECT_EQ(layout.shard_numel, shard) << world << " ranks";
    EXPECT_EQ(layout.world_size, world);
    EXPECT_GE(layout.padded_numel(), layout.numel) << world << " ranks: the last elements are in no shard";
    EXPECT_EQ(layout.offsets, (std::vector<int64_t>{0, 6, 10}));
  }
}

TEST(ShardedTraining1_Layout, NoParametersIsAnEmptyBuffer) {
  const auto layout = zero_lab::flat_layout({}, 4);
  EXPECT_TRUE(layout.offsets.empty());
  EXPECT_EQ(layout.numel, 0);
  EXPECT_EQ(layout.shard_numel, 0);
}

// ---------------------------------------------------------------- TODO(sharded_training-2): the sharded step

// A two-layer network as bare tensors: 6x5 + 6 + 3x6 + 3 = 57 parameters (no world size of 2 or
// 4 divides it: the last shard is padded). Its initial values, the same for every rank.
std::vector<torch::Tensor> initial_parameters() {
  auto gen = at::detail::createCPUGenerator(7);
  return {at::randn({6, 5}, gen), at::randn({6}, gen), at::randn({3, 6}, gen), at::randn({3}, gen)};
}

torch::Tensor loss_of(const std::vector<torch::Tensor>& p, const torch::Tensor& x, const torch::Tensor& y) {
  return torch::mse_loss(torch::linear(torch::tanh(torch::linear(x, p[0], p[1])), p[2], p[3]), y);
}

// Step `step`'s global batch: 4 rows per rank.
std::pair<torch::Tensor, torch::Tensor> global_batch(int world_size, int step) {
  auto gen = at::detail::createCPUGenerator(100 + step);
  return {at::randn({4 * world_size, 5}, gen), at::randn({4 * world_size, 3}, gen)};
}

zero_lab::AdamWOptions adamw_options() {
  zero_lab::AdamWOptions o;
  o.lr = 0.05;
  o.weight_decay = 0.1;
  return o;
}

std::vector<torch::Tensor> fresh_parameters() {
  std::vector<torch::Tensor> params;
  for (const auto& t : initial_parameters()) params.push_back(t.clone().requires_grad_(true));
  return params;
}

// torch's AdamW on one process with the whole batch: what every rank's parameters must be after
// `steps` sharded steps. Also the whole-batch gradient of the last step, flattened.
std::pair<torch::Tensor, torch::Tensor> torch_adamw(int world_size, int steps) {
  auto params = fresh_parameters();
  const auto o = adamw_options();
  torch::optim::AdamW adamw(params, torch::optim::AdamWOptions(o.lr).weight_decay(o.weight_decay));
  std::vector<torch::Tensor> grads;
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = global_batch(world_size, s);
    adamw.zero_grad();
    loss_of(params, x, y).backward();
    grads.clear();
    for (auto& p : params) grads.push_back(p.grad().flatten().clone());
    adamw.step();
  }
  std::vector<torch::Tensor> flat;
  for (auto& p : params) flat.push_back(p.detach().flatten());
  return {torch::cat(flat), torch::cat(grads)};
}

torch::Tensor flat_values(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> flat;
  for (const auto& p : params) flat.push_back(p.detach().flatten());
  return torch::cat(flat);
}

// Each rank trains `steps` sharded steps on its rows; `after(rank, optimizer, params)` checks.
void sharded_training(int world_size, int steps,
                      const std::function<void(int, const zero_lab::ShardedAdamW&, const std::vector<torch::Tensor>&)>& after) {
  auto errors = run_ranks(world_size, [&](std::shared_ptr<dist::Communicator> comm) {
    auto params = fresh_parameters();
    zero_lab::ShardedAdamW adamw(params, comm, adamw_options());
    for (int s = 0; s < steps; ++s) {
      auto [x, y] = global_batch(world_size, s);
      adamw.zero_grad();
      loss_of(params, x.narrow(0, 4 * comm->rank(), 4), y.narrow(0, 4 * comm->rank(), 4)).backward();
      adamw.step();
    }
    after(comm->rank(), adamw, params);
  });
  EXPECT_TRUE(all_ranks_finished(errors));
}

class ShardedTraining2_Step : public ::testing::TestWithParam<int> {};

// What each rank ended with: its parameters (flat), the gradient shard it stepped with and its
// layout, kept for the checks, which run here on the test's thread.
struct RankEnd {
  torch::Tensor params, grad_shard;
  zero_lab::FlatLayout layout;
  int rank = 0;
  // This rank's shard of the whole batch's gradient `whole_batch_grad` (flat), cut as its layout
  // cuts: what grad_shard must hold.
  torch::Tensor shard_of(const torch::Tensor& whole_batch_grad) const {
    auto padded = torch::zeros({layout.padded_numel()});
    padded.narrow(0, 0, layout.numel).copy_(whole_batch_grad);
    return padded.narrow(0, layout.shard_begin(rank), layout.shard_numel).clone();
  }
};

std::vector<RankEnd> rank_ends(int world_size, int steps) {
  std::mutex mutex;
  std::vector<RankEnd> ends(world_size);
  sharded_training(world_size, steps,
                   [&](int rank, const zero_lab::ShardedAdamW& adamw, const std::vector<torch::Tensor>& params) {
                     std::lock_guard<std::mutex> lock(mutex);
                     ends[rank] = {flat_values(params).clone(), adamw.grad_shard().clone(), adamw.layout(), rank};
                   });
  return ends;
}

TEST_P(ShardedTraining2_Step, EveryRankEndsWithTorchsAdamWOnTheWholeBatch) {
  const int world_size = GetParam();
  const auto ends = rank_ends(world_size, 3);
  // torch's AdamW after the ranks' steps: while the code under test runs, its answer is nowhere in the process.
  const auto expected = torch_adamw(world_size, 3).first;
  for (int r = 0; r < world_size; ++r) {
    ASSERT_TRUE(ends[r].params.defined()) << "rank " << r << " did not finish";
    // fp32 tolerance: one process averages the loss over all rows at once, the ranks their own.
    EXPECT_TRUE(test::tensors_close(ends[r].params, expected, 1e-5, 1e-6))
        << "rank " << r << ": after 3 steps the parameters are not torch's AdamW's on the whole batch (every shard "
        << "must be stepped, and every rank must get every shard)";
  }
}

TEST_P(ShardedTraining2_Step, EachRankStepsWithTheMeanOfItsShardsGradients) {
  const int world_size = GetParam();
  const auto ends = rank_ends(world_size, 1);
  const auto whole = torch_adamw(world_size, 1).second;
  for (int r = 0; r < world_size; ++r) {
    ASSERT_TRUE(ends[r].grad_shard.defined()) << "rank " << r << " did not finish";
    EXPECT_TRUE(test::tensors_close(ends[r].grad_shard, [&] { return ends[r].shard_of(whole); }, 1e-5, 1e-7))
        << "rank " << r << ": grad_shard() is not the mean over the ranks of this shard's gradients";
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShardedTraining2_Step, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return std::to_string(info.param) + "ranks"; });

TEST(ShardedTraining2_Step_Alone, OneRankIsTorchsAdamW) {
  auto comm = dist::make_communicator(dist::WorldInfo{}, {}, torch::kCPU);
  auto params = fresh_parameters();
  zero_lab::ShardedAdamW adamw(params, comm, adamw_options());
  for (int s = 0; s < 4; ++s) {
    auto [x, y] = global_batch(1, s);
    adamw.zero_grad();
    loss_of(params, x, y).backward();
    adamw.step();
  }
  EXPECT_TRUE(test::tensors_close(flat_values(params), torch_adamw(1, 4).first, 1e-5, 1e-6))
      << "after 4 steps alone, the parameters are not torch's AdamW's";
  EXPECT_EQ(adamw.steps(), 4);
}

// ---------------------------------------------------------------- TODO(sharded_training-4): ZeRO-2

// The test network's parameters in two buckets, one per layer (57 = 36 + 21 elements: no world
// size of 2 or 4 divides the second).
std::vector<std::vector<torch::Tensor>> two_buckets(const std::vector<torch::Tensor>& params) {
  return {{params[0], params[1]}, {params[2], params[3]}};
}

// Counts the collectives issued; `during_backward` what was issued while a backward ran.
class CountingCommunicator final : public dist::ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  std::shared_ptr<dist::Work> reduce_scatter(torch::Tensor output, torch::Tensor input, dist::Reduction op) override {
    reduce_scatters.push_back(input.numel());
    return inner_->reduce_scatter(std::move(output), std::move(input), op);
  }
  std::shared_ptr<dist::Work> all_gather(torch::Tensor output, torch::Tensor input) override {
    ++all_gathers;
    return inner_->all_gather(std::move(output), std::move(input));
  }
  std::vector<int64_t> reduce_scatters;  // each one's input elements, in the order issued
  int all_gathers = 0;
};

// What a rank saw in its last ZeRO-2 step: its parameters, each bucket's gradient shard, and
// whether any parameter still held a whole gradient after backward.
struct Zero2End {
  torch::Tensor params;
  std::vector<torch::Tensor> grad_shards;
  int64_t gradient_bytes_after_backward = -1, shard_bytes = 0;
  std::vector<int64_t> reduce_scatters_during_backward;
  int all_gathers_during_backward = -1;
};

std::vector<Zero2End> zero2_ends(int world_size, int steps) {
  std::mutex mutex;
  std::vector<Zero2End> ends(world_size);
  auto errors = run_ranks(world_size, [&](std::shared_ptr<dist::Communicator> inner) {
    auto comm = std::make_shared<CountingCommunicator>(inner);
    auto params = fresh_parameters();
    zero_lab::ShardedGradientsAdamW adamw(two_buckets(params), comm, adamw_options());
    Zero2End end;
    for (int s = 0; s < steps; ++s) {
      auto [x, y] = global_batch(world_size, s);
      adamw.zero_grad();
      comm->reduce_scatters.clear();
      comm->all_gathers = 0;
      loss_of(params, x.narrow(0, 4 * comm->rank(), 4), y.narrow(0, 4 * comm->rank(), 4)).backward();
      end.reduce_scatters_during_backward = comm->reduce_scatters;
      end.all_gathers_during_backward = comm->all_gathers;
      end.gradient_bytes_after_backward = adamw.gradient_bytes();
      adamw.step();
    }
    end.params = flat_values(params).clone();
    for (const auto& b : adamw.buckets()) {
      end.grad_shards.push_back(b.grad_shard.clone());
      end.shard_bytes += b.grad_shard.nbytes();
    }
    std::lock_guard<std::mutex> lock(mutex);
    ends[comm->rank()] = end;
  });
  EXPECT_TRUE(all_ranks_finished(errors));
  return ends;
}

// Rank `rank`'s shard of the whole-batch gradient's elements [begin, begin + numel) (one bucket or
// unit, its own flat buffer padded for `world_size` ranks): what that rank's grad_shard must hold.
torch::Tensor expected_grad_shard(const torch::Tensor& whole, int64_t begin, int64_t numel, int world_size, int rank) {
  const int64_t shard = dist::shard_numel(numel, world_size);
  auto padded = torch::zeros({shard * world_size});
  padded.narrow(0, 0, numel).copy_(whole.narrow(0, begin, numel));
  return padded.narrow(0, rank * shard, shard);
}

class ShardedTraining4_Zero2 : public ::testing::TestWithParam<int> {};

TEST_P(ShardedTraining4_Zero2, EveryRankEndsWithTorchsAdamWOnTheWholeBatch) {
  const int world_size = GetParam();
  const auto ends = zero2_ends(world_size, 3);
  const auto expected = torch_adamw(world_size, 3).first;
  for (int r = 0; r < world_size; ++r) {
    ASSERT_TRUE(ends[r].params.defined()) << "rank " << r << " did not finish";
    EXPECT_TRUE(test::tensors_close(ends[r].params, expected, 1e-5, 1e-6))
        << "rank " << r << ": after 3 ZeRO-2 steps the parameters are not torch's AdamW's on the whole batch";
  }
}

// Between steps a rank keeps only its shard of each bucket's averaged gradient: the whole
// gradients are freed as their bucket's reduce-scatter starts.
TEST_P(ShardedTraining4_Zero2, EachRankKeepsOnlyItsShardOfTheMeanGradient) {
  const int world_size = GetParam();
  const auto ends = zero2_ends(world_size, 1);
  const auto whole = torch_adamw(world_size, 1).second;  // the whole batch's gradient, flat (57)
  const std::pair<int64_t, int64_t> buckets[] = {{0, 36}, {36, 21}};  // each bucket's elements in `whole`
  for (int r = 0; r < world_size; ++r) {
    ASSERT_EQ(ends[r].grad_shards.size(), 2u) << "rank " << r << " did not finish";
    EXPECT_EQ(ends[r].gradient_bytes_after_backward, ends[r].shard_bytes)
        << "rank " << r << ": after backward the parameters still hold whole gradients (free each .grad once its "
        << "bucket's reduce-scatter has started)";
    for (int b = 0; b < 2; ++b) {
      const auto expected = expected_grad_shard(whole, buckets[b].first, buckets[b].second, world_size, r);
      EXPECT_TRUE(test::tensors_close(ends[r].grad_shards[b], expected, 1e-5, 1e-7))
          << "rank " << r << ", bucket " << b << ": the gradient shard is not the mean over the ranks of its chunk";
    }
  }
}

// The reduce-scatters travel while backward computes: both were issued before backward returned,
// the last layer's bucket first (backward finishes it first), and no all-gather ran yet.
TEST_P(ShardedTraining4_Zero2, EachBucketIsReduceScatteredDuringBackwardAsItFinishes) {
  const int world_size = GetParam();
  const auto ends = zero2_ends(world_size, 2);
  const int64_t first = dist::shard_numel(21, world_size) * world_size, second = dist::shard_numel(36, world_size) * world_size;
  for (int r = 0; r < world_size; ++r) {
    EXPECT_EQ(ends[r].reduce_scatters_during_backward, (std::vector<int64_t>{first, second}))
        << "rank " << r << ": the reduce-scatters issued while backward ran (input elements, in order): one per "
        << "bucket, padded, as soon as its last gradient is ready";
    EXPECT_EQ(ends[r].all_gathers_during_backward, 0) << "rank " << r << ": the all-gathers belong to step()";
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShardedTraining4_Zero2, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return std::to_string(info.param) + "ranks"; });

TEST(ShardedTraining4_Zero2_Alone, AParameterWithoutAGradientIsAnErrorNamingItsBucket) {
  auto comm = dist::make_communicator(dist::WorldInfo{}, {}, torch::kCPU);
  auto params = fresh_parameters();
  auto unused = torch::zeros({3}, torch::requires_grad());
  zero_lab::ShardedGradientsAdamW adamw({{params[0], params[1]}, {params[2], params[3], unused}}, comm, adamw_options());
  auto [x, y] = global_batch(1, 0);
  adamw.zero_grad();
  loss_of(params, x, y).backward();
  try {
    adamw.step();
    FAIL() << "step() after a backward that left a parameter of bucket 1 without a gradient must throw";
  } catch (const amplab::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bucket 1"), std::string::npos) << e.what();
  }
}

TEST(ShardedTraining4_Zero2_Alone, OneRankIsTorchsAdamW) {
  auto comm = dist::make_communicator(dist::WorldInfo{}, {}, torch::kCPU);
  auto params = fresh_parameters();
  zero_lab::ShardedGradientsAdamW adamw(two_buckets(params), comm, adamw_options());
  for (int s = 0; s < 4; ++s) {
    auto [x, y] = global_batch(1, s);
    adamw.zero_grad();
    loss_of(params, x, y).backward();
    adamw.step();
  }
  EXPECT_TRUE(test::tensors_close(flat_values(params), torch_adamw(1, 4).first, 1e-5, 1e-6))
      << "after 4 ZeRO-2 steps alone, the parameters are not torch's AdamW's";
  EXPECT_EQ(adamw.steps(), 4);
}

// ---------------------------------------------------------------- TODO(sharded_training-5): ZeRO-3

// The test network as modules, with initial_parameters()'s values: Linear(5, 6), Tanh, Linear(6, 3).
torch::nn::Sequential test_network() {
  torch::nn::Sequential net(torch::nn::Linear(5, 6), torch::nn::Tanh(), torch::nn::Linear(6, 3));
  torch::NoGradGuard no_grad;
  const auto init = initial_parameters();
  auto params = net->parameters();
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(init[i]);
  return net;
}

std::shared_ptr<zero_lab::Mlp> test_mlp() { return std::make_shared<zero_lab::Mlp>(test_network()); }

// The matrix products this thread has run (aten::linear, mm, addmm, matmul...), counted by a
// RecordFunction callback while a MatmulCounter lives: where each collective was issued between
// a layer's computations.
thread_local int64_t t_matmuls = 0;

std::unique_ptr<at::ObserverContext> count_matmul(const at::RecordFunction& fn) {
  static const std::set<std::string_view> kMatmuls{"aten::linear", "aten::mm",     "aten::addmm", "aten::matmul",
                                                   "aten::bmm",    "aten::baddbmm", "aten::einsum", "aten::mv",
                                                   "aten::addmv",  "aten::_addmm_activation"};
  if (kMatmuls.count(std::string_view(fn.name()))) ++t_matmuls;
  return nullptr;
}

class MatmulCounter {
 public:
  MatmulCounter()
      : handle_(at::addGlobalCallback(at::RecordFunctionCallback(count_matmul).scopes({at::RecordScope::FUNCTION}))) {}
  ~MatmulCounter() { at::removeCallback(handle_); }
  MatmulCounter(const MatmulCounter&) = delete;
  MatmulCounter& operator=(const MatmulCounter&) = delete;

 private:
  at::CallbackHandle handle_;
};

// Records the collectives in order ("AG 36" for an all-gather of 36 elements, "RS 22" for a
// reduce-scatter of 22), the matrix products run before each, and the all-gathers' outputs, to
// tell which are still alive.
class CollectiveLog final : public dist::ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  std::shared_ptr<dist::Work> all_gather(torch::Tensor output, torch::Tensor input) override {
    calls.push_back("AG " + std::to_string(output.numel()));
    matmuls_before.push_back(t_matmuls);
    dtypes.push_back("AG " + std::string(c10::toString(output.scalar_type())));
    gathered.push_back(output.storage().getWeakStorageImpl());  // a unit's whole buffer, whose memory comes and goes
    return inner_->all_gather(std::move(output), std::move(input));
  }
  std::shared_ptr<dist::Work> reduce_scatter(torch::Tensor output, torch::Tensor input, dist::Reduction op) override {
    calls.push_back("RS " + std::to_string(input.numel()));
    matmuls_before.push_back(t_matmuls);
    dtypes.push_back("RS " + std::string(c10::toString(input.scalar_type())));
    return inner_->reduce_scatter(std::move(output), std::move(input), op);
  }
  // How many gathered buffers still hold memory (whole units someone holds).
  int alive() const {
    int n = 0;
    for (const auto& g : gathered) {
      auto storage = g.lock();
      n += storage && storage->nbytes() > 0 ? 1 : 0;
    }
    return n;
  }
  std::vector<std::string> calls, dtypes;
  std::vector<int64_t> matmuls_before;  // per call: the matrix products this thread had run
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> gathered;
};

struct Zero3End {
  torch::Tensor params;
  std::vector<torch::Tensor> grad_shards;
  int whole_after_forward = -1, whole_after_backward = -1;
  int gradients_after_backward = -1;  // parameters still holding a whole .grad after backward
  std::vector<std::string> calls;  // the last step's collectives
  std::vector<int64_t> matmuls_before;  // and the matrix products run before each
};

std::vector<Zero3End> zero3_ends(int world_size, int steps) {
  std::mutex mutex;
  std::vector<Zero3End> ends(world_size);
  auto errors = run_ranks(world_size, [&](std::shared_ptr<dist::Communicator> inner) {
    auto comm = std::make_shared<CollectiveLog>(inner);
    zero_lab::FullyShardedModel model(test_mlp(), comm, adamw_options());
    Zero3End end;
    for (int s = 0; s < steps; ++s) {
      auto [x, y] = global_batch(world_size, s);
      comm->calls.clear();
      comm->matmuls_before.clear();
      comm->gathered.clear();
      model.zero_grad();
      auto loss = torch::mse_loss(model.forward(x.narrow(0, 4 * comm->rank(), 4)), y.narrow(0, 4 * comm->rank(), 4));
      end.whole_after_forward = comm->alive();
      loss.backward();
      end.whole_after_backward = comm->alive();
      end.gradients_after_backward = 0;
      for (auto& unit : model.units())
        for (const auto& p : unit.params) end.gradients_after_backward += p.grad().defined() ? 1 : 0;
      model.step();
      end.calls = comm->calls;
      end.matmuls_before = comm->matmuls_before;
    }
    for (const auto& unit : model.units()) end.grad_shards.push_back(unit.grad_shard.clone());
    end.params = model.full_parameters();
    std::lock_guard<std::mutex> lock(mutex);
    ends[comm->rank()] = end;
  });
  EXPECT_TRUE(all_ranks_finished(errors));
  return ends;
}

class ShardedTraining5_Fsdp : public ::testing::TestWithParam<int> {};

TEST_P(ShardedTraining5_Fsdp, EveryRankEndsWithTorchsAdamWOnTheWholeBatch) {
  const int world_size = GetParam();
  const auto ends = zero3_ends(world_size, 3);
  const auto expected = torch_adamw(world_size, 3).first;
  for (int r = 0; r < world_size; ++r) {
    ASSERT_TRUE(ends[r].params.defined()) << "rank " << r << " did not finish";
    EXPECT_TRUE(test::tensors_close(ends[r].params, expected, 1e-5, 1e-6))
        << "rank " << r << ": after 3 ZeRO-3 steps the gathered parameters are not torch's AdamW's on the whole batch";
  }
}

// Between its forward and its backward a layer is not whole anywhere: after forward, and again
// after backward, no gathered buffer holds memory and after backward no parameter holds a whole
// gradient; each rank's gradient shard is the ranks' mean.
TEST_P(ShardedTraining5_Fsdp, NoLayerStaysWholeAndEachRankGetsItsShardOfTheMeanGradient) {
  const int world_size = GetParam();
  const auto ends = zero3_ends(world_size, 1);
  const auto whole = torch_adamw(world_size, 1).second;
  const std::pair<int64_t, int64_t> units[] = {{0, 36}, {36, 21}};
  for (int r = 0; r < world_size; ++r) {
    ASSERT_EQ(ends[r].grad_shards.size(), 2u) << "rank " << r << " did not finish";
    EXPECT_EQ(ends[r].whole_after_forward, 0)
        << "rank " << r << ": after forward, whole layers are still alive (saved for backward?): ZeRO-3 gathers "
        << "them again in backward";
    EXPECT_EQ(ends[r].whole_after_backward, 0) << "rank " << r << ": after backward, whole layers are still alive";
    EXPECT_EQ(ends[r].gradients_after_backward, 0)
        << "rank " << r << ": after backward, parameters still hold their whole gradients (.grad): once a unit's "
        << "gradient is on its way to the shards, after_backward lets it go";
    for (int u = 0; u < 2; ++u) {
      const auto expected = expected_grad_shard(whole, units[u].first, units[u].second, world_size, r);
      EXPECT_TRUE(test::tensors_close(ends[r].grad_shards[u], expected, 1e-5, 1e-7))
          << "rank " << r << ", unit " << u << ": grad_shard is not the mean over the ranks of its chunk";
    }
  }
}

// Each layer is gathered for its forward and again for its backward, the next one's gather
// issued before this one computes (forward: the layer after; backward: the layer before), and
// each gradient reduce-scattered once.
TEST_P(ShardedTraining5_Fsdp, EachLayerIsGatheredTwiceAndTheNextOneIsPrefetched) {
  const int world_size = GetParam();
  const auto ends = zero3_ends(world_size, 2);
  const std::string first = std::to_string(dist::shard_numel(36, world_size) * world_size),
                    second = std::to_string(dist::shard_numel(21, world_size) * world_size);
  const std::vector<std::string> expected = {"AG " + first,  "AG " + second,  // forward: layer 0, prefetch of 1
                                             "AG " + second, "AG " + first,   // backward: layer 1, prefetch of 0
                                             "RS " + second, "RS " + first};
  for (int r = 0; r < world_size; ++r)
    EXPECT_EQ(ends[r].calls, expected) << "rank " << r << ": the collectives of one step, in order";
}

// A prefetch travels while the layer computes only if it is issued before the layer's matrix
// products: in forward, layer 1's all-gather before layer 0's product; in backward, layer 0's
// all-gather before layer 1's products. Issued after them, the step's collectives come in the
// same order, but each gather waits for a computation it could have overlapped (on a GPU the
// communication stream starts a collective only after the work queued before it).
TEST(ShardedTraining5_Fsdp_Prefetch, EachPrefetchIsIssuedBeforeTheLayerComputes) {
  MatmulCounter counter;
  const auto ends = zero3_ends(2, 1);
  for (int r = 0; r < 2; ++r) {
    const auto& e = ends[r];
    ASSERT_EQ(e.calls.size(), 6u) << "rank " << r << ": one step's collectives, expected 4 all-gathers and 2 "
                                  << "reduce-scatters (EachLayerIsGatheredTwiceAndTheNextOneIsPrefetched)";
    ASSERT_EQ(e.matmuls_before.size(), e.calls.size());
    EXPECT_EQ(e.matmuls_before[1], e.matmuls_before[0])
        << "rank " << r << ": in forward, layer 1's prefetch was issued after layer 0's matrix product ("
        << e.matmuls_before[1] - e.matmuls_before[0] << " product op(s) counted between): start it before computing";
    EXPECT_EQ(e.matmuls_before[3], e.matmuls_before[2])
        << "rank " << r << ": in backward, layer 0's prefetch was issued after layer 1's backward products ("
        << e.matmuls_before[3] - e.matmuls_before[2] << " product op(s) counted between): start it before computing";
    EXPECT_GT(e.matmuls_before[4], e.matmuls_before[2])
        << "rank " << r << ": layer 1's gradient was reduce-scattered before any of its backward's products";
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShardedTraining5_Fsdp, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return std::to_string(info.param) + "ranks"; });

// FSDP's mixed precision: the gathers and the layers' compute in bf16 over fp32 shards, the
// gradients reduced in fp32 or in bf16. The parameters and their gradients are bf16 then:
// nothing in your moments may assume fp32.
TEST(ShardedTraining5_Fsdp_MixedPrecision, Bf16ComputeOverFp32ShardsTrainsLikeFp32) {
  for (auto reduce : {torch::kFloat32, torch::kBFloat16}) {
    std::mutex mutex;
    std::vector<torch::Tensor> params(2);
    std::vector<std::vector<std::string>> dtypes(2);
    auto errors = run_ranks(2, [&](std::shared_ptr<dist::Communicator> inner) {
      auto comm = std::make_shared<CollectiveLog>(inner);
      zero_lab::FullyShardedModel model(test_mlp(), comm, adamw_options(), /*prefetch=*/true,
                                        zero_lab::ShardedPrecision{torch::kBFloat16, reduce});
      for (int s = 0; s < 3; ++s) {
        auto [x, y] = global_batch(2, s);
        comm->dtypes.clear();
        auto out = model.forward(x.narrow(0, 4 * comm->rank(), 4));
        ASSERT_EQ(out.scalar_type(), torch::kFloat32) << "the model's output comes back in fp32";
        torch::mse_loss(out, y.narrow(0, 4 * comm->rank(), 4)).backward();
        model.step();
      }
      for (const auto& unit : model.units()) ASSERT_EQ(unit.shard.scalar_type(), torch::kFloat32) << "the shards stay fp32";
      const auto last_step = comm->dtypes;
      auto mine = model.full_parameters();
      std::lock_guard<std::mutex> lock(mutex);
      params[comm->rank()] = mine;
      dtypes[comm->rank()] = last_step;
    });
    ASSERT_TRUE(all_ranks_finished(errors)) << c10::toString(reduce);
    const auto expected = torch_adamw(2, 3).first;
    const std::string rs = std::string("RS ") + c10::toString(reduce);
    const std::vector<std::string> collectives = {"AG BFloat16", "AG BFloat16", "AG BFloat16", "AG BFloat16", rs, rs};
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(dtypes[r], collectives) << "rank " << r << ", reduction in " << c10::toString(reduce)
                                        << ": the dtypes of the last step's collectives";
      // bf16 keeps 8 bits: three steps of lr 0.05 stay within 0.01 of fp32 training.
      EXPECT_TRUE(test::tensors_close(params[r], expected, 0, 1e-2))
          << "rank " << r << ", reduction in " << c10::toString(reduce) << ": bf16 compute strayed from fp32 training";
    }
  }
}

TEST(ShardedTraining5_Fsdp_Alone, OneRankIsTorchsAdamW) {
  auto comm = dist::make_communicator(dist::WorldInfo{}, {}, torch::kCPU);
  zero_lab::FullyShardedModel model(test_mlp(), comm, adamw_options());
  for (int s = 0; s < 4; ++s) {
    auto [x, y] = global_batch(1, s);
    model.zero_grad();
    torch::mse_loss(model.forward(x), y).backward();
    model.step();
  }
  EXPECT_TRUE(test::tensors_close(model.full_parameters(), torch_adamw(1, 4).first, 1e-5, 1e-6))
      << "after 4 ZeRO-3 steps alone, the parameters are not torch's AdamW's";
  EXPECT_EQ(model.steps(), 4);
}

TEST(ShardedTraining5_Fsdp_Alone, AStepWithoutABackwardIsAnErrorNamingTheUnit) {
  auto comm = dist::make_communicator(dist::WorldInfo{}, {}, torch::kCPU);
  zero_lab::FullyShardedModel model(test_mlp(), comm, adamw_options());
  try {
    model.step();
    FAIL() << "step() before any backward must throw: no unit has a gradient";
  } catch (const amplab::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unit 0"), std::string::npos) << e.what();
  }
}

// Lab 7's GPT, tiny: units of many tensors (a block's LayerNorms, attention and MLP), and the
// embeddings used twice (the output layer is the token embedding's matrix).
zero_lab::GptShape tiny_gpt(int64_t batch) { return {/*layers=*/2, /*width=*/16, /*heads=*/2, /*context=*/8, /*vocab=*/32, batch}; }

// The attention's key bias gets a gradient of rounding noise only (adding a constant to every
// score of a row leaves its softmax as it is), which AdamW's first step would turn into lr-sized
// steps of either sign: a larger eps keeps those steps below the comparison's tolerance.
zero_lab::AdamWOptions gpt_adamw_options() {
  auto o = adamw_options();
  o.eps = 1e-4;
  return o;
}

// Every parameter of `model` flat, unit by unit (the order of full_parameters()).
torch::Tensor flat_by_units(zero_lab::LabModel& model) {
  std::vector<torch::Tensor> flat;
  for (const auto& unit : model.units())
    for (const auto& p : unit->parameters()) flat.push_back(p.detach().flatten());
  return torch::cat(flat);
}

struct GptEnd {
  torch::Tensor params;
  int whole_after_forward = -1, whole_after_backward = -1;
  std::vector<std::string> calls;  // the last step's collectives
};

// `steps` ZeRO-3 steps of the tiny GPT on 2 ranks, 2 sequences each.
std::vector<GptEnd> gpt_zero3_ends(int steps) {
  std::mutex mutex;
  std::vector<GptEnd> ends(2);
  auto errors = run_ranks(2, [&](std::shared_ptr<dist::Communicator> inner) {
    auto comm = std::make_shared<CollectiveLog>(inner);
    zero_lab::FullyShardedModel model(std::make_shared<zero_lab::Gpt>(tiny_gpt(2), 3), comm, gpt_adamw_options());
    GptEnd end;
    for (int s = 0; s < steps; ++s) {
      auto [x, y] = model.model().batch(5, s, comm->rank(), 2, torch::kCPU);
      comm->calls.clear();
      comm->gathered.clear();
      model.zero_grad();
      auto loss = model.loss(model.forward(x), y);
      end.whole_after_forward = comm->alive();
      loss.backward();
      end.whole_after_backward = comm->alive();
      model.step();
      end.calls = comm->calls;
    }
    end.params = model.full_parameters();
    std::lock_guard<std::mutex> lock(mutex);
    ends[comm->rank()] = end;
  });
  EXPECT_TRUE(all_ranks_finished(errors));
  return ends;
}

TEST(ShardedTraining5_Fsdp_Gpt, ATinyGptOnTwoRanksEndsWithTorchsAdamWOnTheWholeBatch) {
  const auto ends = gpt_zero3_ends(2);
  zero_lab::Gpt whole(tiny_gpt(4), 3);  // one process, both ranks' sequences
  const auto o = gpt_adamw_options();
  torch::optim::AdamW adamw(whole.parameters(), torch::optim::AdamWOptions(o.lr).weight_decay(o.weight_decay).eps(o.eps));
  for (int s = 0; s < 2; ++s) {
    auto [x, y] = whole.batch(5, s, 0, 1, torch::kCPU);
    adamw.zero_grad();
    whole.loss(whole.forward(x), y).backward();
    adamw.step();
  }
  const auto expected = flat_by_units(whole);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(ends[r].params.defined()) << "rank " << r << " did not finish";
    EXPECT_TRUE(test::tensors_close(ends[r].params, expected, 1e-4, 1e-5))
        << "rank " << r << ": after 2 ZeRO-3 steps of the GPT (blocks of 12 tensors, the embedding used twice) the "
        << "gathered parameters are not torch's AdamW's on the whole batch";
  }
}

// Units 0 (the embeddings and final LayerNorm, used first and last), 1 and 2 (the blocks): the
// embeddings are gathered once and stay whole until their backward; each block is gathered for
// its forward and again for its backward, the next one prefetched; the gradients reduce-scattered
// as backward finishes each unit, the embeddings' last.
TEST(ShardedTraining5_Fsdp_Gpt, TheEmbeddingsStayWholeFromForwardToBackwardAndEachBlockIsGatheredTwice) {
  const auto ends = gpt_zero3_ends(1);
  const int64_t C = 16, ends_numel = 32 * C + 8 * C + 2 * C, block_numel = 12 * C * C + 13 * C;
  const std::string e = std::to_string(dist::shard_numel(ends_numel, 2) * 2), b = std::to_string(dist::shard_numel(block_numel, 2) * 2);
  const std::vector<std::string> expected = {"AG " + e, "AG " + b, "AG " + b,   // forward: the ends, block 0, block 1 prefetched
                                             "AG " + b, "AG " + b,              // backward: block 1, block 0 prefetched
                                             "RS " + b, "RS " + b, "RS " + e};
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ends[r].calls, expected) << "rank " << r << ": the collectives of one step, in order";
    EXPECT_EQ(ends[r].whole_after_forward, 1) << "rank " << r << ": after forward, only the embeddings' unit is whole";
    EXPECT_EQ(ends[r].whole_after_backward, 0) << "rank " << r << ": after backward, a unit is still whole";
  }
}

// ---------------------------------------------------------------- TODO(sharded_training-6): the sharded checkpoint

// Trains `steps` ZeRO-3 steps on `world_size` ranks; with `save_after` >= 0, saves into `dir`
// after that many steps and goes on from a new model loaded from it. Returns each rank's
// parameters and moments at the end, flat.
std::vector<torch::Tensor> zero3_with_checkpoint(int world_size, int steps, int save_after, const std::string& dir) {
  std::mutex mutex;
  std::vector<torch::Tensor> ends(world_size);
  auto errors = run_ranks(world_size, [&](std::shared_ptr<dist::Communicator> comm) {
    auto model = std::make_unique<zero_lab::FullyShardedModel>(test_mlp(), comm, adamw_options());
    for (int s = 0; s < steps; ++s) {
      if (s == save_after) {
        zero_lab::save_sharded(*model, dir);
        model = std::make_unique<zero_lab::FullyShardedModel>(test_mlp(), comm, adamw_options());
        zero_lab::load_sharded(*model, dir);
        ASSERT_EQ(model->steps(), s) << "the step count comes back with the checkpoint";
      }
      auto [x, y] = global_batch(world_size, s);
      torch::mse_loss(model->forward(x.narrow(0, 4 * comm->rank(), 4)), y.narrow(0, 4 * comm->rank(), 4)).backward();
      model->step();
    }
    std::vector<torch::Tensor> state{model->full_parameters()};
    for (const auto& unit : model->units()) state.insert(state.end(), {unit.exp_avg, unit.exp_avg_sq});
    std::lock_guard<std::mutex> lock(mutex);
    ends[comm->rank()] = torch::cat(state);
  });
  EXPECT_TRUE(all_ranks_finished(errors));
  return ends;
}

TEST(ShardedTraining6_Checkpoint, ResumingOnTheSameRanksContinuesToTheBit) {
  test::TempDir dir;
  const auto straight = zero3_with_checkpoint(2, 3, -1, "");
  const auto resumed = zero3_with_checkpoint(2, 3, 2, dir.path().string());
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(straight[r].defined() && resumed[r].defined()) << "rank " << r << " did not finish";
    EXPECT_TRUE(torch::equal(straight[r], resumed[r]))
        << "rank " << r << ": 2 steps, a checkpoint, a new model loaded from it and 1 step must give the bits of 3 "
        << "steps straight (parameters, both moments, and the step count AdamW's bias correction uses)";
  }
}

TEST(ShardedTraining6_Checkpoint, EachRankWritesOnlyItsOwnShards) {
  test::TempDir dir;
  zero3_with_checkpoint(2, 2, 1, dir.path().string());
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) files.push_back(entry.path().filename().string());
  ASSERT_EQ(files.size(), 2u) << "one file per rank";
  int64_t held = 0;  // what one rank holds: 3 tensors (shard, two moments) of each unit's shard
  for (int64_t numel : {36, 21}) held += 3 * dist::shard_numel(numel, 2);
  for (const auto& f : files) {
    const auto saved = amplab::load_safetensors(dir.file(f));
    int64_t numel = 0;
    for (const auto& [name, t] : saved.tensors) numel += t.numel();
    EXPECT_EQ(numel, held) << f << ": a rank's file holds its shards and their moments, not the whole model";
  }
}

TEST(ShardedTraining6_Checkpoint, AnotherWorldSizeIsRefusedAndLeavesTheModelAsItWas) {
  test::TempDir dir;
  zero3_with_checkpoint(2, 2, 1, dir.path().string());  // two files, of 2 ranks
  auto comm = dist::make_communicator(dist::WorldInfo{}, {}, torch::kCPU);
  zero_lab::FullyShardedModel model(test_mlp(), comm, adamw_options());
  const auto before = model.full_parameters();
  try {
    zero_lab::load_sharded(model, dir.path().string());
    FAIL() << "a checkpoint of 2 ranks loaded into 1 must be an amplab::Error";
  } catch (const amplab::Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir.path().string()), std::string::npos) << "the error names the checkpoint: " << e.what();
  }
  EXPECT_TRUE(torch::equal(model.full_parameters(), before)) << "a refused checkpoint changes nothing";
  EXPECT_EQ(model.steps(), 0);
}

TEST(ShardedTraining6_Checkpoint, ATensorOfAnotherShapeIsRefusedBeforeAnythingIsCopied) {
  test::TempDir dir;
  auto comm = dist::make_communicator(dist::WorldInfo{}, {}, torch::kCPU);
  zero_lab::FullyShardedModel saved(test_mlp(), comm, adamw_options());
  zero_lab::save_sharded(saved, dir.path().string());
  // The same file, its last unit's second moment one element short.
  const std::string file = dir.file("rank-0-of-1.safetensors");
  auto on_disk = amplab::load_safetensors(file);
  auto& last = on_disk.tensors.back().second;
  last = last.narrow(0, 0, last.numel() - 1).clone();
  amplab::save_safetensors(file, on_disk.tensors, on_disk.metadata);
  zero_lab::FullyShardedModel model(test_mlp(), comm, adamw_options());
  {
    torch::NoGradGuard no_grad;
    model.units()[0].shard.add_(1);  // so that a copy of the file's first tensor would show
  }
  const auto before = model.full_parameters();
  EXPECT_THROW(zero_lab::load_sharded(model, dir.path().string()), amplab::Error);
  EXPECT_TRUE(torch::equal(model.full_parameters(), before)) << "the first units were copied before the bad one was seen";
}

// ---------------------------------------------------------------- TODO(sharded_training-7): re-sharding

// Every unit's moments whole and flat, in the model's order (a collective, like full_parameters).
torch::Tensor full_moments(zero_lab::FullyShardedModel& model) {
  std::vector<torch::Tensor> parts;
  for (auto& unit : model.units())
    for (const auto& moment : {unit.exp_avg, unit.exp_avg_sq}) {
      torch::Tensor whole = torch::empty({unit.layout.padded_numel()}, moment.options());
      model.communicator().all_gather(whole, moment)->wait();
      parts.push_back(whole.narrow(0, 0, unit.layout.numel));
    }
  return torch::cat(parts);
}

struct WholeState {
  torch::Tensor parameters, moments;
  int64_t steps = -1;
};

// Trains 2 ZeRO-3 steps on `saved_world` ranks and saves them into `dir`; returns the whole state then.
WholeState train_and_save(int saved_world, const std::string& dir) {
  WholeState saved;
  std::mutex mutex;
  auto errors = run_ranks(saved_world, [&](std::shared_ptr<dist::Communicator> comm) {
    zero_lab::FullyShardedModel model(test_mlp(), comm, adamw_options());
    for (int s = 0; s < 2; ++s) {
      auto [x, y] = global_batch(saved_world, s);
      torch::mse_loss(model.forward(x.narrow(0, 4 * comm->rank(), 4)), y.narrow(0, 4 * comm->rank(), 4)).backward();
      model.step();
    }
    zero_lab::save_sharded(model, dir);
    auto parameters = model.full_parameters();
    auto moments = full_moments(model);
    std::lock_guard<std::mutex> lock(mutex);
    if (comm->rank() == 0) saved = {parameters, moments, model.steps()};
  });
  EXPECT_TRUE(all_ranks_finished(errors));
  return saved;
}

// Loads `dir` with load_resharded on `world` ranks; each rank's whole state afterwards.
std::vector<WholeState> load_on(int world, const std::string& dir) {
  std::vector<WholeState> loaded(world);
  std::mutex mutex;
  auto errors = run_ranks(world, [&](std::shared_ptr<dist::Communicator> comm) {
    zero_lab::FullyShardedModel model(test_mlp(), comm, adamw_options());
    zero_lab::load_resharded(model, dir);
    auto parameters = model.full_parameters();
    auto moments = full_moments(model);
    std::lock_guard<std::mutex> lock(mutex);
    loaded[comm->rank()] = {parameters, moments, model.steps()};
  });
  EXPECT_TRUE(all_ranks_finished(errors));
  return loaded;
}

class ShardedTraining7_Resharding : public ::testing::TestWithParam<std::pair<int, int>> {};

// Units of 36 and 21 elements: saved on 2 ranks (shards of 18 and 11, the last padded) and loaded
// on 3 (12 and 7: a new shard spans two saved ones), or saved on 3 and loaded on 2 or on 1.
TEST_P(ShardedTraining7_Resharding, TheWholeStateComesBackToTheBitOnAnotherNumberOfRanks) {
  const auto [saved_world, world] = GetParam();
  test::TempDir dir;
  const WholeState saved = train_and_save(saved_world, dir.path().string());
  ASSERT_TRUE(saved.parameters.defined()) << "training and saving on " << saved_world << " ranks did not finish";
  const auto loaded = load_on(world, dir.path().string());
  for (int r = 0; r < world; ++r) {
    ASSERT_TRUE(loaded[r].parameters.defined()) << "rank " << r << " of " << world << " did not finish loading";
    EXPECT_TRUE(torch::equal(loaded[r].parameters, saved.parameters))
        << "saved on " << saved_world << " ranks, loaded on " << world << ": the parameters, gathered, are not the saved ones";
    EXPECT_TRUE(torch::equal(loaded[r].moments, saved.moments))
        << "saved on " << saved_world << " ranks, loaded on " << world << ": AdamW's moments, gathered, are not the saved ones";
    EXPECT_EQ(loaded[r].steps, saved.steps) << "the step count comes back too";
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShardedTraining7_Resharding,
                         ::testing::Values(std::pair{2, 3}, std::pair{3, 2}, std::pair{3, 1}),
                         [](const auto& info) {
                           return std::to_string(info.param.first) + "to" + std::to_string(info.param.second);
                         });

TEST(ShardedTraining7_Resharding_Alone, AMissingRankFileIsNamedAndChangesNothing) {
  test::TempDir dir;
  train_and_save(3, dir.path().string());
  std::filesystem::remove(dir.file("rank-1-of-3.safetensors"));
  auto comm = dist::make_communicator(dist::WorldInfo{}, {}, torch::kCPU);
  zero_lab::FullyShardedModel model(test_mlp(), comm, adamw_options());
  const auto before = model.full_parameters();
  try {
    zero_lab::load_resharded(model, dir.path().string());
    FAIL() << "a checkpoint of 3 ranks without rank 1's file must be an amplab::Error";
  } catch (const amplab::Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank-1-of-3.safetensors"), std::string::npos) << "the error names the missing file: " << e.what();
  }
  EXPECT_TRUE(torch::equal(model.full_parameters(), before)) << "a refused checkpoint changes nothing";
  EXPECT_EQ(model.steps(), 0);
}

// ---------------------------------------------------------------- TODO(sharded_training-3): memory per rank

void expect_bytes(const zero_lab::MemoryEstimate& m, int64_t parameters, int64_t gradients, int64_t state,
                  const std::string& what) {
  EXPECT_EQ(m.parameters, parameters) << what << ": parameters";
  EXPECT_EQ(m.gradients, gradients) << what << ": gradients";
  EXPECT_EQ(m.optimizer_state, state) << what << ": optimizer state";
}

TEST(ShardedTraining3_Memory, Fp32EachStageShardsOneMorePart) {
  expect_bytes(zero_lab::estimate_memory(1000, 4, 0, false), 4000, 4000, 8000, "stage 0 (DDP)");
  expect_bytes(zero_lab::estimate_memory(1000, 4, 1, false), 4000, 4000, 2000, "stage 1");
  expect_bytes(zero_lab::estimate_memory(1000, 4, 2, false), 4000, 1000, 2000, "stage 2");
  expect_bytes(zero_lab::estimate_memory(1000, 4, 3, false), 1000, 1000, 2000, "stage 3");
}

TEST(ShardedTraining3_Memory, MixedPrecisionKeepsAnFp32MasterCopyInTheOptimizerState) {
  const auto ddp = zero_lab::estimate_memory(1000, 4, 0, true);
  expect_bytes(ddp, 2000, 2000, 12000, "stage 0 (DDP)");
  EXPECT_EQ(ddp.total(), 16 * 1000) << "16 bytes per parameter";
  expect_bytes(zero_lab::estimate_memory(1000, 4, 1, true), 2000, 2000, 3000, "stage 1");
  expect_bytes(zero_lab::estimate_memory(1000, 4, 3, true), 500, 500, 3000, "stage 3");
}

TEST(ShardedTraining3_Memory, AShardIsRoundedUpAndOneRankHoldsEverything) {
  expect_bytes(zero_lab::estimate_memory(10, 4, 3, false), 12, 12, 24, "10 parameters on 4 ranks, stage 3");
  expect_bytes(zero_lab::estimate_memory(10, 1, 3, false), 40, 40, 80, "one rank, stage 3");
}

// ---------------------------------------------------------------- the lab binary on two GPUs (NCCL)

// The lab binary on two GPUs through the launcher, `settings` added to its command line; rank 0's
// summary.json (its stages table and its keys). `binary` is the lab binary's path.
nlohmann::json lab_summary_on_two_gpus(const std::string& binary, const std::string& out_dir,
                                       const std::vector<std::string>& settings) {
  std::vector<std::string> command{test::binary_dir() + "/bin/amplab-run", "--nproc-per-node", "2", "--", binary,
                                   "--set", "run.out_dir=" + out_dir};
  for (const auto& s : settings) command.insert(command.end(), {"--set", s});
  std::string out;
  const int code = test::run(command, &out, 300);
  EXPECT_EQ(code, 0) << out;
  const nlohmann::json summary = test::lab_run_summary(out_dir);
  if (summary.is_null()) ADD_FAILURE() << out;
  return summary;
}

const nlohmann::json* stage_row(const nlohmann::json& summary, const std::string& stage) {
  if (!summary.contains("stages")) return nullptr;
  for (const auto& row : summary.at("stages"))
    if (row.at("stage") == stage) return &row;
  return nullptr;
}

// Every stage trains on two GPUs over NCCL with DDP's losses, and ZeRO-3 holds about half of what
// DDP holds: each rank keeps 1/2 of the parameters, gradients and moments (the estimate's 8 of 16
// bytes a parameter), whatever else the allocator keeps aside.
TEST(ShardedTrainingGpu, EveryStageTrainsLikeDdpAndZero3HoldsHalfOnTwoGpus_CUDA) {
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  test::TempDir dir;
  const auto summary = lab_summary_on_two_gpus(test::binary_dir() + "/bin/" + AMPLAB_LAB_BINARY, dir.file("runs"),
                                               {"model.width=2048", "model.layers=4", "train.steps=10"});
  ASSERT_TRUE(summary.contains("losses_match")) << summary.dump();
  EXPECT_TRUE(summary.at("losses_match").get<bool>())
      << "the stages' losses differ from DDP's by " << summary.at("largest_relative_loss_difference");
  const auto* ddp = stage_row(summary, "ddp");
  const auto* zero3 = stage_row(summary, "zero-3");
  ASSERT_TRUE(ddp && zero3) << summary.at("stages").dump();
  ASSERT_EQ(zero3->at("outcome"), "trained");
  const double ratio = zero3->at("held_bytes").get<double>() / ddp->at("held_bytes").get<double>();
  EXPECT_LT(ratio, 0.6) << "ZeRO-3 holds " << zero3->at("held_bytes") << " bytes after training, DDP "
                        << ddp->at("held_bytes") << ": a whole layer kept between steps, or a gradient never freed?";
  EXPECT_TRUE(summary.at("checkpoint").at("restored_to_the_bit").get<bool>()) << summary.at("checkpoint").dump();
}

// ZeRO-3's step on two GPUs against the reference's, on a model where a layer's all-gather takes
// about as long as its matmuls (a batch of 128 rows of width 4096), so that a gather that waits
// for the matmul before it (a prefetch issued too late, or none) shows. The reference runs in the course's own lab binary, built from the
// solution: scripts/grade puts it beside the student's as <lab>-reference; in the instructor's
// build the lab binary is the reference already. Full points within 10%, none at twice the
// reference's time, a share in between; none when the stages' losses do not match DDP's.
double zero3_step_ms(bool reference, const std::string& out_dir) {
  std::string binary = test::binary_dir() + "/bin/" + AMPLAB_LAB_BINARY;
  const std::string course_binary = test::binary_dir() + "/bin/sharded_training-reference";
  if (reference && std::filesystem::exists(course_binary)) binary = course_binary;
  const auto summary = lab_summary_on_two_gpus(
      binary, out_dir, {"model.width=4096", "model.layers=8", "model.batch=128", "train.steps=25", "train.warmup=5"});
  const auto* zero3 = stage_row(summary, "zero-3");
  if (!zero3 || zero3->at("outcome") != "trained") {
    ADD_FAILURE() << "ZeRO-3 did not train: " << summary.dump();
    return 0;
  }
  // Speed counts only for a step that trains as DDP does: a layer that skips its gather or its
  // gradient is fast and wrong.
  if (!summary.value("losses_match", false)) {
    ADD_FAILURE() << "ZeRO-3's losses differ from DDP's by " << summary.value("largest_relative_loss_difference", -1.0)
                  << " (relative): its time earns no points until it trains as DDP does";
    return 0;
  }
  return zero3->at("step_ms").get<double>();
}

TEST(ShardedTraining5_Speed, Zero3WithinTenPercentOfTheReference_CUDA) {
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  test::TempDir dir;
  const auto [reference, mine] = test::fastest_of_turns(
      [&](int round) { return zero3_step_ms(/*reference=*/true, dir.file("reference-" + std::to_string(round))); },
      [&](int round) { return zero3_step_ms(/*reference=*/false, dir.file("yours-" + std::to_string(round))); });
  ASSERT_GT(mine, 0);
  ASSERT_GT(reference, 0);
  test::record_time_ratio_points(mine / reference, "ZeRO-3 " + std::to_string(mine) + " ms/step, the reference " +
                                                       std::to_string(reference) + " ms/step");
}

}  // namespace
