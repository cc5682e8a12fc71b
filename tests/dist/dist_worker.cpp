// One worker of the distributed tests: dist_test starts it through amplab-run
// (amplab-run --nproc-per-node W -- dist_worker <scenario>) or alone with a hand-made
// environment. Each check prints "rank R: ok <check>"; a failed one ends the process with
// "error: FAIL <check>: <detail>" and exit code 1; an amplab::Error exits with 2 (guarded_main).
//
// Scenarios run on the cpu backend (CI has no GPU); with --nccl they run on cuda:LOCAL_RANK over
// the nccl backend instead (dist_test's *_CUDA test, on machines with two GPUs or more). Checks
// that hold to the bit only for the cpu backend's rank-order sums become fp32 tolerances there.
#include <torch/torch.h>

#include <chrono>
#include <csignal>
#include <iostream>
#include <optional>
#include <thread>

#include "amplab/infra/app.hpp"
#include "amplab/dist/communicator.hpp"
#include "amplab/dist/world.hpp"
#include "amplab/infra/error.hpp"
#include "amplab/fast/fast_path.hpp"
#include "amplab/train/precision.hpp"
#include "amplab/train/trainer.hpp"
#include "data_parallel.hpp"  // lab 5's reference DDP (BucketedDdp)
#include "support.hpp"

namespace {

using namespace amplab;
using DistributedDataParallel = ddp_lab::BucketedDdp;

// 512 bytes: splits the test MLP into two buckets, [fc3.bias, fc3.weight, fc2.bias, fc2.weight]
// (closed by fc2.weight, 1 KiB, which is reduced in its own .grad beside the other three's flat
// buffer) and [fc1.bias, fc1.weight] (never full, sent when complete): bucket ordering, both kinds
// of part, and partial buckets are exercised.
constexpr double kTinyBucketMb = 512.0 / (1024 * 1024);
constexpr int64_t kIn = 6, kHidden = 16, kOut = 3;
constexpr double kLr = 0.1;

int g_rank = 0;
bool g_nccl = false;                   // --nccl: the nccl backend on GPUs
torch::Device g_device = torch::kCPU;  // where tensors live: cpu, or cuda:LOCAL_RANK with --nccl

torch::Tensor on_device(const torch::Tensor& t) { return t.to(g_device); }
// Work::wait() only orders the GPU stream; timings and "it finished" need the host to wait.
void synchronize_device() {
  if (g_device.is_cuda()) torch::cuda::synchronize();
}

void ok(const std::string& check) { std::cout << "rank " << g_rank << ": ok " << check << std::endl; }

[[noreturn]] void fail(const std::string& check, const std::string& detail) {
  throw std::runtime_error("FAIL " + check + " on rank " + std::to_string(g_rank) + ": " + detail);
}

void expect(bool condition, const std::string& check, const std::string& detail = "") {
  if (!condition) fail(check, detail);
}

std::string bytes_of(const torch::Tensor& t) {
  auto c = t.detach().cpu().contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.nbytes());
}

// The same bits on every rank.
void expect_same_on_all_ranks(dist::Communicator& comm, const torch::Tensor& t, const std::string& check) {
  auto all = comm.all_gather_bytes(bytes_of(t));
  for (int r = 1; r < comm.size(); ++r)
    if (all[r] != all[0]) fail(check, "rank " + std::to_string(r) + " differs from rank 0");
}

void expect_close(const torch::Tensor& actual, const torch::Tensor& expected, double rtol, double atol,
                  const std::string& check_name) {
  const std::string& check = check_name;
  auto a = actual.detach().cpu().to(torch::kFloat64), e = expected.detach().cpu().to(torch::kFloat64);
  if (a.sizes() != e.sizes()) fail(check, "sizes differ");
  auto error = (a - e).abs();
  auto bound = atol + rtol * e.abs();
  if ((error > bound).any().item<bool>()) {
    auto flat_error = error.flatten(), flat_bound = bound.flatten();
    int64_t i = (flat_error > flat_bound).nonzero()[0][0].item<int64_t>();
    std::ostringstream detail;
    detail << "first mismatch at flat index " << i << ": actual " << a.flatten()[i].item<double>() << ", expected "
           << e.flatten()[i].item<double>() << "; largest error " << error.max().item<double>();
    fail(check, detail.str());
  }
}

// The cpu backend's results repeat to the bit; NCCL's sums may round differently between runs
// of different bucketings, so there the same result means equal within fp32 rounding.
void expect_same_result(const torch::Tensor& actual, const torch::Tensor& expected, const std::string& check) {
  if (g_nccl) expect_close(actual, expected, 1e-6, 1e-7, check);
  else expect(bytes_of(actual) == bytes_of(expected), check, "the bits differ");
}

struct Mlp : torch::nn::Module {
  explicit Mlp(bool with_extra = false) {
    fc1 = register_module("fc1", torch::nn::Linear(kIn, kHidden));
    fc2 = register_module("fc2", torch::nn::Linear(kHidden, kHidden));
    fc3 = register_module("fc3", torch::nn::Linear(kHidden, kOut));
    if (with_extra) extra = register_module("extra", torch::nn::Linear(kHidden, kOut));
    // Stands for BatchNorm's running statistics: each rank changes it differently.
    running = register_buffer("running", torch::zeros({kOut}));
  }
  torch::Tensor forward(const torch::Tensor& x, bool use_extra = false) {
    auto h = torch::tanh(fc2(torch::tanh(fc1(x))));
    auto y = fc3(h);
    if (use_extra) y = y + extra(h);
    return y;
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr}, extra{nullptr};
  torch::Tensor running;
};

torch::Tensor flat_params(torch::nn::Module& m) {
  std::vector<torch::Tensor> pieces;
  for (const auto& p : m.parameters()) pieces.push_back(p.detach().reshape({-1}));
  return torch::cat(pieces).cpu();
}

torch::Tensor flat_grads(torch::nn::Module& m) {
  std::vector<torch::Tensor> pieces;
  for (const auto& p : m.parameters()) pieces.push_back(p.grad().reshape({-1}));
  return torch::cat(pieces).cpu();
}

std::shared_ptr<dist::Communicator> connect(double timeout_s = 30) {
  auto world = dist::world_from_env();
  g_rank = world.rank;
  dist::DistConfig config;
  config.backend = g_nccl ? dist::Backend::nccl : dist::Backend::cpu;
  config.timeout_s = timeout_s;
  auto comm = dist::make_communicator(world, config, g_nccl ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU));
  g_device = comm->device();
  return comm;
}

// ---------------------------------------------------------------- collectives

// Reduce-scatter and all-gather against all-reduce: the chunk this rank gets is that chunk of the
// all-reduce (to the bit on the cpu backend), in place or not; a length the world size does not
// divide goes padded; a whole of the wrong size is refused by name before anything is sent.
void shard_collectives(dist::Communicator& comm) {
  const int W = comm.size(), r = comm.rank();
  const int64_t n = 5;
  torch::manual_seed(99 + r);
  auto input = on_device(torch::randn({W * n}));
  auto reduced = input.clone();
  comm.all_reduce_sum({reduced})->wait();
  auto mine = reduced.narrow(0, r * n, n);
  auto output = on_device(torch::empty({n}));
  comm.reduce_scatter(output, input)->wait();
  expect_same_result(output, mine, "reduce-scatter = this rank's chunk of the all-reduce");
  auto in_place = input.clone();
  comm.reduce_scatter(in_place.narrow(0, r * n, n), in_place)->wait();
  expect_same_result(in_place.narrow(0, r * n, n), mine, "reduce-scatter in place");
  comm.reduce_scatter(output, input, dist::Reduction::mean)->wait();
  expect_close(output, mine / W, 1e-6, 1e-6, "reduce-scatter mean = sum / world size");
  auto halves = input.to(torch::kBFloat16), half_out = on_device(torch::empty({n}, torch::kBFloat16));
  comm.reduce_scatter(half_out, halves)->wait();
  expect_close(half_out, mine, 2e-2, 2e-2, "reduce-scatter of bf16");

  auto gathered = on_device(torch::empty({W * 3}, torch::kInt64));
  comm.all_gather(gathered, on_device(torch::full({3}, 10 * r, torch::kInt64)))->wait();
  auto in_place_gather = on_device(torch::full({W * 3}, -1, torch::kInt64));
  in_place_gather.narrow(0, r * 3, 3).fill_(10 * r);
  comm.all_gather(in_place_gather, in_place_gather.narrow(0, r * 3, 3))->wait();
  auto expected = torch::arange(W, torch::kInt64).mul(10).repeat_interleave(3);
  expect(gathered.cpu().equal(expected), "all-gather: chunk q is rank q's tensor");
  expect(in_place_gather.cpu().equal(expected), "all-gather in place");

  // 10 elements on W ranks: shards of shard_numel(10, W), the tail padded with zeros; the
  // reduce-scattered shards all-gathered back and cut to 10 are the all-reduce of the 10.
  const int64_t numel = 10, shard = dist::shard_numel(numel, W);
  auto values = on_device(torch::randn({numel}));
  auto padded = on_device(torch::zeros({W * shard}));
  padded.narrow(0, 0, numel).copy_(values);
  auto my_shard = on_device(torch::empty({shard}));
  comm.reduce_scatter(my_shard, padded)->wait();
  auto whole = on_device(torch::empty({W * shard}));
  comm.all_gather(whole, my_shard)->wait();
  comm.all_reduce_sum({values})->wait();
  expect_same_result(whole.narrow(0, 0, numel), values, "uneven: padded reduce-scatter + all-gather = all-reduce");
  expect(whole.narrow(0, numel, W * shard - numel).eq(0).all().item<bool>(), "uneven: the padding stays zero");

  try {
    comm.reduce_scatter(on_device(torch::empty({n + 1})), input);
    fail("a whole of the wrong size is refused", "no error");
  } catch (const Error& e) {
    expect(std::string(e.what()).find("pad the whole to world size x shard_numel") != std::string::npos,
           "a whole of the wrong size is refused", e.what());
  }
  ok("reduce-scatter and all-gather");
}

int collectives() {
  auto comm = connect();
  const int W = comm->size(), r = comm->rank();

  // Two all-reduces in flight at once, several dtypes, waited in reverse order.
  auto a = on_device(torch::arange(10, torch::kFloat32) * (r + 1) + 0.25);
  auto b = on_device(torch::full({3, 4}, r + 1, torch::kInt64));
  auto h = on_device(torch::full({7}, 0.5 * (r + 1), torch::kFloat16));
  torch::manual_seed(1234 + r);
  auto c = on_device(torch::randn({1000}, torch::kFloat32));
  auto inputs = comm->all_gather_bytes(bytes_of(c));
  auto work1 = comm->all_reduce_sum({a, b, h});
  auto work2 = comm->all_reduce_sum({c});
  work2->wait();
  work1->wait();
  double tri = W * (W + 1) / 2.0;
  expect_close(a, torch::arange(10, torch::kFloat32) * tri + 0.25 * W, 1e-6, 1e-6, "all-reduce float32");
  expect(b.cpu().equal(torch::full({3, 4}, static_cast<int64_t>(tri), torch::kInt64)), "all-reduce int64");
  expect_close(h.to(torch::kFloat32), torch::full({7}, 0.5 * tri), 1e-3, 1e-3, "all-reduce float16");
  // The sum of everyone's inputs in rank order, computed here: the cpu backend's, to the bit.
  torch::Tensor expected = torch::zeros({1000});
  for (int q = 0; q < W; ++q) {
    auto input = torch::from_blob(inputs[q].data(), {1000}, torch::kFloat32);
    expected = q == 0 ? input.clone() : expected.add_(input);
  }
  if (g_nccl) expect_close(c, expected, 1e-6, 1e-6, "all-reduce of random values");
  else expect(bytes_of(c) == bytes_of(expected), "all-reduce is the rank-order sum, to the bit");
  expect_same_on_all_ranks(*comm, c, "all-reduce gives every rank the same bits");
  // 12 MB: more than the store takes in one message (8 MiB), so it travels in chunks.
  auto big = on_device(torch::full({3'000'000}, static_cast<float>(r + 1)));
  comm->all_reduce_sum({big})->wait();
  expect(big.eq(static_cast<float>(tri)).all().item<bool>(), "all-reduce of 12 MB (chunked)");
  ok("all-reduce");

  // Broadcast from the last rank, two dtypes.
  auto f = on_device(torch::full({5}, static_cast<float>(r)));
  auto i = on_device(torch::full({2, 2}, r, torch::kInt32));
  comm->broadcast({f, i}, W - 1);
  f = f.cpu();
  i = i.cpu();
  expect(f.equal(torch::full({5}, static_cast<float>(W - 1))) && i.equal(torch::full({2, 2}, W - 1, torch::kInt32)),
         "broadcast from the last rank");
  ok("broadcast");

  shard_collectives(*comm);

  // Bytes of different lengths, with NULs.
  std::string mine = std::string(static_cast<size_t>(r), 'x') + '\0' + "rank" + std::to_string(r);
  auto all = comm->all_gather_bytes(mine);
  expect(static_cast<int>(all.size()) == W, "all-gather size");
  for (int q = 0; q < W; ++q)
    expect(all[q] == std::string(static_cast<size_t>(q), 'x') + '\0' + "rank" + std::to_string(q), "all-gather bytes",
           "entry " + std::to_string(q));
  comm->barrier();
  ok("all-gather and barrier");

  // The mean of a metric across ranks.
  auto loss_mean = dist::mean_across_ranks(*comm, on_device(torch::tensor(static_cast<float>(r))));
  auto count_mean = dist::mean_across_ranks(*comm, on_device(torch::tensor(static_cast<int64_t>(2 * r))));
  expect(loss_mean.scalar_type() == torch::kFloat32 && loss_mean.item<double>() == (W - 1) / 2.0,
         "mean of a float metric", std::to_string(loss_mean.item<double>()));
  expect(count_mean.scalar_type() == torch::kFloat64 && count_mean.item<double>() == W - 1.0,
         "mean of an integer metric is float64", std::to_string(count_mean.item<double>()));
  ok("metric helpers");

  // The store must not grow with the number of collectives.
  comm->barrier();
  int64_t before = comm->store_key_count();
  for (int k = 0; k < 200; ++k) comm->all_reduce_sum({on_device(torch::ones({4}))})->wait();
  comm->barrier();
  int64_t after = comm->store_key_count();
  expect(after <= before + 2 * W, "store keys are cleaned up",
         std::to_string(before) + " keys before 200 all-reduces, " + std::to_string(after) + " after");
  ok("store cleanup (" + std::to_string(before) + " -> " + std::to_string(after) + " keys)");

  comm->shutdown();
  return 0;
}

// ---------------------------------------------------------------- DDP training

struct Variant {
  bool overlap = true;
  bool set_to_none = false;
  bool bucket_per_parameter = false;  // a cap below every parameter: each .grad all-reduced in place
  int micro_steps = 1;   // gradient accumulation: micro-batches per optimizer step
  bool no_sync = true;   // accumulate under no_sync() (else synchronize after every micro-step)
};

struct Trained {
  torch::Tensor params;
  DistributedDataParallel::Stats stats;
  size_t buckets = 0;
  int64_t shared = 0;  // parameters sharing a flat buffer (the others are reduced in their own .grad)
};

constexpr int kSteps = 4;
constexpr int64_t kMicroBatch = 4;  // rows per rank per micro-step

// The global batch of step `step`: W * micro_steps * kMicroBatch rows, the same on every rank.
std::pair<torch::Tensor, torch::Tensor> global_batch(int step, int W, int micro_steps) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  int64_t n = W * micro_steps * kMicroBatch;
  auto x = torch::randn({n, kIn}, gen);
  auto y = torch::randn({n, kOut}, gen);
  return {x, y};
}

// One process on the whole global batch: what DDP must reproduce.
torch::Tensor train_reference(int W, int micro_steps) {
  torch::manual_seed(100);  // rank 0's initialization
  auto model = std::make_shared<Mlp>();
  model->to(g_device);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(kLr));
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = global_batch(step, W, micro_steps);
    optimizer.zero_grad();
    torch::mse_loss(model->forward(on_device(x)), on_device(y)).backward();
    optimizer.step();
  }
  return flat_params(*model);
}

Trained train_ddp(const std::shared_ptr<dist::Communicator>& comm, const Variant& v, const std::string& name) {
  const int W = comm->size(), r = comm->rank();
  torch::manual_seed(100 + r);  // different on every rank: DDP must broadcast rank 0's
  auto model = std::make_shared<Mlp>();
  model->to(g_device);
  model->running.fill_(static_cast<float>(r));
  dist::DistConfig config;
  config.bucket_mb = v.bucket_per_parameter ? 1e-6 : kTinyBucketMb;
  config.overlap = v.overlap;
  DistributedDataParallel ddp(model, comm, config);
  expect_same_on_all_ranks(*comm, flat_params(*model), name + ": parameters equal after construction");
  expect_same_on_all_ranks(*comm, model->running, name + ": buffers equal after construction");

  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(kLr));
  for (int step = 0; step < kSteps; ++step) {
    auto [x_cpu, y_cpu] = global_batch(step, W, v.micro_steps);
    auto x = on_device(x_cpu), y = on_device(y_cpu);
    optimizer.zero_grad(v.set_to_none);
    for (int m = 0; m < v.micro_steps; ++m) {
      std::optional<DistributedDataParallel::NoSync> local;
      if (v.no_sync && m + 1 < v.micro_steps) local.emplace(ddp);
      ddp.before_forward();
      expect_same_on_all_ranks(*comm, model->running, name + ": buffers broadcast before forward");
      int64_t first = (static_cast<int64_t>(r) * v.micro_steps + m) * kMicroBatch;
      auto loss = torch::mse_loss(model->forward(x.narrow(0, first, kMicroBatch)), y.narrow(0, first, kMicroBatch)) /
                  v.micro_steps;
      loss.backward();
      model->running.add_(r + 1);  // ranks drift apart, as BatchNorm statistics would
      if (!v.no_sync) ddp.finish_gradient_sync();
    }
    if (v.no_sync) ddp.finish_gradient_sync();
    optimizer.step();
    expect_same_on_all_ranks(*comm, flat_params(*model), name + ": parameters equal on all ranks after step " +
                                                             std::to_string(step));
  }
  auto shared = static_cast<int64_t>(ddp.parameters_sharing_a_buffer().size());
  return {flat_params(*model), ddp.stats(), ddp.bucket_layout().size(), shared};
}

int ddp() {
  auto comm = connect();
  const int W = comm->size();
  // fp32 tolerance, not bitwise: one process averages the loss over W*B rows at once, DDP
  // averages W per-rank means of B rows; and backward's matmuls sum the batch dimension in
  // another order. Both differ by rounding only (a few ulps per step).
  const double rtol = 1e-5, atol = 1e-6;
  torch::Tensor reference = train_reference(W, 1);

  Trained views = train_ddp(comm, {}, "overlap");
  expect_close(views.params, reference, rtol, atol, "DDP with batch B on W ranks = one process with batch W*B");
  expect(views.buckets == 2, "two buckets", std::to_string(views.buckets));
  expect(views.stats.buckets_during_backward == kSteps * 2 && views.stats.buckets_at_finish == 0,
         "overlap: every bucket launched during backward",
         std::to_string(views.stats.buckets_during_backward) + " during, " +
             std::to_string(views.stats.buckets_at_finish) + " at finish");
  expect(views.stats.grad_copies == 0, "zero_grad(false): gradients stay bucket views (no copies)",
         std::to_string(views.stats.grad_copies) + " copies");
  ok("DDP matches one process with the whole batch (world " + std::to_string(W) + ")");

  Trained serial = train_ddp(comm, {.overlap = false}, "no overlap");
  expect_same_result(serial.params, views.params, "overlap off gives the same result as overlap on");
  expect(serial.stats.buckets_during_backward == 0 && serial.stats.buckets_at_finish == kSteps * 2,
         "overlap off: every bucket launched at finish");
  ok("overlap off = overlap on");

  Trained copies = train_ddp(comm, {.set_to_none = true}, "set_to_none");
  expect_same_result(copies.params, views.params, "zero_grad(set_to_none) gives the same result");
  expect(copies.shared > 0 && copies.stats.grad_copies == kSteps * copies.shared,
         "set_to_none: one copy per step for each parameter of a shared bucket (" + std::to_string(copies.shared) + ")",
         std::to_string(copies.stats.grad_copies));
  ok("set_to_none = zero in place");

  for (bool set_to_none : {false, true}) {
    std::string mode = set_to_none ? "set_to_none" : "zero in place";
    Trained alone = train_ddp(comm, {.set_to_none = set_to_none, .bucket_per_parameter = true}, "bucket per parameter, " + mode);
    expect_same_result(alone.params, views.params, "a bucket per parameter (" + mode + ") gives the same result");
    expect(alone.buckets == 6 && alone.stats.grad_copies == 0,
           "a bucket per parameter: six buckets, each .grad all-reduced in place (" + mode + ")",
           std::to_string(alone.buckets) + " buckets, " + std::to_string(alone.stats.grad_copies) + " copies");
  }
  ok("a parameter alone in its bucket is all-reduced in its own .grad");
  comm->shutdown();
  return 0;
}

// Trainer::step under DDP with a fused optimizer (and neither loss scaling nor clipping) updates
// each bucket's parameters as soon as its all-reduce is done; with dist.step_each_bucket=false it
// waits for all buckets and takes one step. Same parameters, to the bit.
std::pair<torch::Tensor, DistributedDataParallel::Stats> train_with_trainer(
    const std::shared_ptr<dist::Communicator>& comm, const std::string& optimizer, bool step_each_bucket) {
  const int W = comm->size(), r = comm->rank();
  torch::manual_seed(100 + r);
  auto model = std::make_shared<Mlp>();
  model->to(g_device);
  dist::DistConfig config;
  config.bucket_mb = kTinyBucketMb;
  config.step_each_bucket = step_each_bucket;
  DistributedDataParallel ddp(model, comm, config);
  TrainConfig train;
  train.optimizer.name = optimizer;
  train.fast_path = true;  // fused SGD or AdamW
  train.optimizer.lr = optimizer == "sgd" ? kLr : 0.01;
  train.optimizer.momentum = optimizer == "sgd" ? 0.9 : 0.0;
  train.progress = false;
  Trainer trainer(model, [&](const Batch& b) { return torch::mse_loss(model->forward(b.input), b.target); }, train, g_device, {}, make_fast_path_optimizer);
  trainer.set_gradient_sync(&ddp);
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = global_batch(step, W, 1);
    Batch mine{on_device(x.narrow(0, r * kMicroBatch, kMicroBatch)), on_device(y.narrow(0, r * kMicroBatch, kMicroBatch))};
    trainer.step(mine);
  }
  return {flat_params(*model), ddp.stats()};
}

int step_each_bucket() {
  auto comm = connect();
  for (const std::string optimizer : {"sgd", "adamw"}) {
    auto [each, each_stats] = train_with_trainer(comm, optimizer, true);
    auto [once, once_stats] = train_with_trainer(comm, optimizer, false);
    expect(each_stats.buckets_handed_over == kSteps * 2 && once_stats.buckets_handed_over == 0,
           "fused " + optimizer + ": the trainer steps each of the 2 buckets as it arrives only when asked to",
           std::to_string(each_stats.buckets_handed_over) + " and " + std::to_string(once_stats.buckets_handed_over));
    expect_same_result(each, once, "fused " + optimizer + ": stepping each bucket = one step after all buckets");
    expect_same_on_all_ranks(*comm, each, "fused " + optimizer + ": parameters equal on all ranks");
    ok("fused " + optimizer + ": each bucket stepped as soon as it is reduced = one step after all");
  }
  comm->shutdown();
  return 0;
}

int accumulate() {
  auto comm = connect();
  const int W = comm->size();
  constexpr int kMicro = 3;
  torch::Tensor reference = train_reference(W, kMicro);

  Trained local = train_ddp(comm, {.micro_steps = kMicro, .no_sync = true}, "no_sync");
  Trained synced = train_ddp(comm, {.micro_steps = kMicro, .no_sync = false}, "sync every micro-step");
  // Not bitwise: no_sync sums the micro-steps' gradients then averages; syncing each micro-step
  // averages each then sums. Same value up to rounding.
  expect_close(local.params, synced.params, 1e-5, 1e-6, "accumulation under no_sync = synchronizing every micro-step");
  expect_close(local.params, reference, 1e-5, 1e-6, "accumulation = one process with the whole batch");
  expect(local.stats.buckets_during_backward == kSteps * 2, "no_sync: one all-reduce per bucket per step",
         std::to_string(local.stats.buckets_during_backward));
  expect(synced.stats.buckets_during_backward == kSteps * kMicro * 2, "without no_sync: one per micro-step",
         std::to_string(synced.stats.buckets_during_backward));
  ok("accumulation with no_sync = without (" + std::to_string(local.stats.buckets_during_backward) + " vs " +
     std::to_string(synced.stats.buckets_during_backward) + " bucket all-reduces)");
  Trained in_place = train_ddp(
      comm, {.set_to_none = true, .bucket_per_parameter = true, .micro_steps = kMicro, .no_sync = true}, "no_sync, in place");
  expect_close(in_place.params, reference, 1e-5, 1e-6, "accumulation with a bucket per parameter = one process");
  ok("accumulation into gradients all-reduced in place");
  comm->shutdown();
  return 0;
}

// ---------------------------------------------------------------- bf16 compression

// What PyTorch's bf16_compress_hook makes of the ranks' gradients g_r: bf16(g_r) / W, summed in
// bf16 in rank order (the cpu backend's order; NCCL's sum of two ranks rounds the same), back to
// fp32.
torch::Tensor hook_average(dist::Communicator& comm, const torch::Tensor& mine) {
  auto all = comm.all_gather_bytes(bytes_of(mine.to(torch::kBFloat16)));
  const int W = comm.size();
  torch::Tensor sum;
  for (int r = 0; r < W; ++r) {
    auto g = torch::from_blob(all[r].data(), mine.sizes(), torch::kBFloat16).clone().div_(W);
    sum = r == 0 ? g : sum.add_(g);
  }
  return sum.to(torch::kFloat32);
}

struct CompressVariant {
  std::string name;
  Precision precision = Precision::bf16_mixed;
  bool bucket_per_parameter = false;
  int micro_steps = 1;  // > 1: accumulation under no_sync
};

// DDP with dist.compression=bf16 leaves in .grad what the hook gives for the gradients the same
// forward/backward leaves in a plain twin model on each rank, bit for bit. Returns how many
// gradients were taken before autocast's cast.
int64_t check_compressed_gradients(const std::shared_ptr<dist::Communicator>& comm, const CompressVariant& v) {
  const int r = comm->rank();
  torch::manual_seed(100);  // the same weights everywhere, so the twin needs no broadcast
  auto model = std::make_shared<Mlp>();
  torch::manual_seed(100);
  auto twin = std::make_shared<Mlp>();
  model->to(g_device);
  twin->to(g_device);
  dist::DistConfig config;
  config.bucket_mb = v.bucket_per_parameter ? 1e-6 : kTinyBucketMb;
  config.compression = dist::Compression::bf16;
  DistributedDataParallel ddp(model, comm, config);
  for (int step = 0; step < 2; ++step) {
    auto [x_cpu, y_cpu] = global_batch(step, comm->size(), v.micro_steps);
    auto x = on_device(x_cpu), y = on_device(y_cpu);
    for (auto* m : {model.get(), twin.get()})
      for (auto& p : m->parameters()) p.mutable_grad() = torch::Tensor();
    for (int micro = 0; micro < v.micro_steps; ++micro) {
      int64_t first = (static_cast<int64_t>(r) * v.micro_steps + micro) * kMicroBatch;
      auto xs = x.narrow(0, first, kMicroBatch), ys = y.narrow(0, first, kMicroBatch);
      std::optional<DistributedDataParallel::NoSync> local;
      if (micro + 1 < v.micro_steps) local.emplace(ddp);
      torch::Tensor loss, twin_loss;
      {
        AutocastGuard autocast(g_device, v.precision);
        loss = torch::mse_loss(model->forward(xs).to(torch::kFloat32), ys);
        twin_loss = torch::mse_loss(twin->forward(xs).to(torch::kFloat32), ys);
      }
      ddp.prepare_for_backward(loss);
      loss.backward();
      twin_loss.backward();
    }
    ddp.finish_gradient_sync();
    auto names = model->named_parameters();
    auto twin_params = twin->parameters();
    for (size_t i = 0; i < names.size(); ++i) {
      const auto& grad = names[i].value().grad();
      auto expected = hook_average(*comm, twin_params[i].grad()).to(g_device);
      expect(grad.defined() && grad.scalar_type() == torch::kFloat32, v.name + ": " + names[i].key() + " has an fp32 .grad");
      expect(bytes_of(grad) == bytes_of(expected), v.name + ": " + names[i].key() + " = bf16_compress_hook's average",
             "largest difference " + std::to_string((grad - expected).abs().max().item<double>()));
    }
    expect_same_on_all_ranks(*comm, flat_grads(*model), v.name + ": gradients equal on all ranks");
    // A step of the DDP model, copied into the twin: the next step starts from other weights.
    torch::NoGradGuard no_grad;
    auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].sub_(params[i].grad(), kLr);
      twin_params[i].copy_(params[i]);
    }
  }
  return ddp.stats().reduced_before_cast;
}

// PyTorch's own DDP with bf16_compress_hook, on two gloo ranks, left these gradients
// (tests/fixtures/make_bf16_compress_golden.py): rank r's parameter p has the gradient c_r, from
// loss = sum(p * c_r) ("fp32") or from a bf16 cast of p ("bf16", as autocast casts a weight).
// The same here, bit for bit; a NaN is a NaN (its sign and payload are the reduction's own).
void check_against_pytorchs_hook(const std::shared_ptr<dist::Communicator>& comm) {
  auto fixture = test::load_fixture("bf16_compress_golden.json");
  auto c = test::tensor_from_bits(fixture.at("gradients").at(comm->rank())).to(g_device);
  for (const std::string kind : {"fp32", "bf16"}) {
    auto module = std::make_shared<torch::nn::Module>();
    auto p = module->register_parameter("p", torch::zeros({c.numel()}, g_device));
    dist::DistConfig config;
    config.compression = dist::Compression::bf16;
    DistributedDataParallel ddp(module, comm, config);
    auto loss = kind == "bf16" ? (p.to(torch::kBFloat16) * c.to(torch::kBFloat16)).to(torch::kFloat32).sum() : (p * c).sum();
    ddp.prepare_for_backward(loss);
    loss.backward();
    ddp.finish_gradient_sync();
    auto actual = p.grad().cpu(), expected = test::tensor_from_bits(fixture.at("expected").at(kind));
    const std::string check = "dist.compression=bf16 = PyTorch DDP with bf16_compress_hook (" + kind + " gradients)";
    expect(torch::equal(actual.isnan(), expected.isnan()), check, "NaN at other places");
    auto numbers = ~expected.isnan();
    expect(torch::equal(actual.masked_select(numbers).view(torch::kInt32), expected.masked_select(numbers).view(torch::kInt32)),
           check, "the bits differ");
    expect(ddp.stats().reduced_before_cast == (kind == "bf16" ? 1 : 0), check + ": taken before the cast only from a cast",
           std::to_string(ddp.stats().reduced_before_cast));
  }
  ok("bf16 compression = PyTorch's DDP with bf16_compress_hook, bit for bit");
}

int compress() {
  auto comm = connect();
  if (comm->size() == 2) check_against_pytorchs_hook(comm);
  const int64_t steps = 2;
  // bf16 autocast: a weight's or bias's gradient leaves autocast's cast; those alone in their
  // bucket are taken before it (fc2.weight with the tiny buckets, all six with a bucket each).
  int64_t taken = check_compressed_gradients(comm, {"bf16-mixed, shared buckets"});
  expect(taken == steps * 1, "shared buckets: only fc2.weight, alone in its bucket, is taken before the cast",
         std::to_string(taken));
  taken = check_compressed_gradients(comm, {"bf16-mixed, a bucket per parameter", Precision::bf16_mixed, true});
  expect(taken == steps * 6, "a bucket per parameter: all six gradients are taken before the cast", std::to_string(taken));
  ok("bf16 compression under bf16 autocast = PyTorch's bf16_compress_hook");
  // No cast to take the gradient from: every bucket is rounded to bf16 when it is sent.
  taken = check_compressed_gradients(comm, {"fp32, a bucket per parameter", Precision::fp32, true});
  expect(taken == 0, "fp32: no gradient comes from a cast", std::to_string(taken));
  // Accumulation: the hook rounds the accumulated gradient, so nothing is taken before a cast.
  taken = check_compressed_gradients(comm, {"bf16-mixed, no_sync accumulation", Precision::bf16_mixed, true, 3});
  expect(taken == 0, "accumulation: the accumulated fp32 gradient is what is sent", std::to_string(taken));
  ok("bf16 compression of fp32 and of accumulated gradients = PyTorch's bf16_compress_hook");
  comm->shutdown();
  return 0;
}

// A layer only rank 0 uses, then a step where nobody uses it; then the one-backward rule.
int unused() {
  auto comm = connect();
  const int W = comm->size(), r = comm->rank();
  // Shared buckets (slices of a flat buffer), then a bucket per parameter (.grad reduced in place).
  for (double bucket_mb : {kTinyBucketMb, 1e-6}) {
    const std::string layout = bucket_mb == kTinyBucketMb ? " (shared buckets)" : " (a bucket per parameter)";
    torch::manual_seed(7);
    auto model = std::make_shared<Mlp>(/*with_extra=*/true);
    model->to(g_device);
    dist::DistConfig config;
    config.bucket_mb = bucket_mb;
    DistributedDataParallel ddp(model, comm, config);
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(kLr));
    auto x = on_device(torch::randn({4, kIn})), y = on_device(torch::randn({4, kOut}));  // same seed: same on every rank

    // Step 1: only rank 0 takes the extra branch. Its bucket (the first: extra is registered
    // last) cannot complete during backward elsewhere, so other ranks send it at finish time.
    optimizer.zero_grad(false);
    auto loss = torch::mse_loss(model->forward(x, /*use_extra=*/r == 0), y);
    // This rank's own gradient of extra.weight (autograd::grad fills no .grad and runs no hooks);
    // .grad itself cannot be read before finish: its bucket may already be in flight.
    torch::Tensor local_extra_grad =
        r == 0 ? torch::autograd::grad({loss}, {model->extra->weight}, {}, /*retain_graph=*/true)[0]
               : torch::zeros_like(model->extra->weight);
    loss.backward();
    ddp.finish_gradient_sync();
    auto all_local = comm->all_gather_bytes(bytes_of(local_extra_grad));
    auto rank0_local = torch::from_blob(all_local[0].data(), local_extra_grad.sizes(), torch::kFloat32);
    expect(model->extra->weight.grad().defined(), "unused on some ranks: .grad is defined after finish");
    expect_close(model->extra->weight.grad(), rank0_local / W, 1e-6, 1e-7,
                 "a parameter used on rank 0 only gets rank 0's gradient / W everywhere");
    expect_same_on_all_ranks(*comm, model->extra->weight.grad(), "its gradient is equal on all ranks");
    if (r != 0) expect(ddp.stats().unused_parameters == 2, "unused parameters counted", std::to_string(ddp.stats().unused_parameters));
    optimizer.step();
    expect_same_on_all_ranks(*comm, flat_params(*model), "parameters equal after a step with a rank-0-only layer");
    ok("a parameter unused on some ranks" + layout);

    // Step 2: nobody uses it (with set_to_none: its .grad is undefined before finish).
    optimizer.zero_grad(true);
    torch::mse_loss(model->forward(x, false), y).backward();
    ddp.finish_gradient_sync();
    expect(model->extra->weight.grad().defined() && model->extra->weight.grad().abs().sum().item<double>() == 0,
           "unused everywhere: zero gradient after finish");
    optimizer.step();
    expect_same_on_all_ranks(*comm, flat_params(*model), "parameters equal after a step with an unused layer");
    ok("a parameter unused on all ranks" + layout);

    // Two backwards without finish_gradient_sync in between: a clear error, on every rank.
    optimizer.zero_grad(false);
    torch::mse_loss(model->forward(x, true), y).backward();
    bool threw = false;
    try {
      torch::mse_loss(model->forward(x, true), y).backward();
    } catch (const std::exception& e) {
      threw = std::string(e.what()).find("second gradient before finish_gradient_sync()") != std::string::npos;
      if (!threw) fail("second backward error", e.what());
    }
    expect(threw, "a second backward before finish_gradient_sync() is an error");
    ddp.finish_gradient_sync();  // the first backward's buckets are in flight: settle them
    ok("one backward per step is enforced" + layout);
  }
  comm->shutdown();
  return 0;
}

// Rank 0 builds Linear(8, 5), the others Linear(8, 4): construction must fail, naming both.
int mismatch() {
  auto comm = connect();
  auto model = std::make_shared<torch::nn::Module>();
  model->register_module("fc", torch::nn::Linear(8, comm->rank() == 0 ? 5 : 4));
  model->to(g_device);
  DistributedDataParallel ddp(model, comm, {});
  fail("mismatch", "construction succeeded");
}

// ---------------------------------------------------------------- failures and signals

// Rank `dying` dies by SIGKILL while the others wait in an all-reduce with a long timeout:
// the launcher, not the timeout, must end them. (Alone, without the launcher, the others
// fail on their own: at the timeout, or at once when rank 0 and its store are gone.)
int die(int dying, double timeout_s) {
  auto comm = connect(timeout_s);
  comm->barrier();
  if (comm->rank() == dying) {
    std::cout << "rank " << dying << ": dying" << std::endl;
    std::raise(SIGKILL);
  }
  comm->all_reduce_sum({on_device(torch::ones({4}))})->wait();
  synchronize_device();
  fail("die", "the all-reduce completed without rank " + std::to_string(dying));
}

// Rank `leaving` leaves the group on purpose (it ended, or a signal stopped it early) while the
// others start an all-reduce it will never join: they must fail at once, not at the timeout.
int leave(int leaving, double timeout_s) {
  auto comm = connect(timeout_s);
  comm->barrier();
  if (comm->rank() == leaving) {
    comm->shutdown();
    std::cout << "rank " << leaving << ": left" << std::endl;
    return 0;
  }
  comm->all_reduce_sum({on_device(torch::ones({4}))})->wait();
  synchronize_device();
  fail("leave", "the all-reduce completed without rank " + std::to_string(leaving));
}

// Joins the group (alone: the test starts one rank only) with a short timeout.
int join(double timeout_s) {
  auto comm = connect(timeout_s);
  comm->barrier();
  fail("join", "joined a group whose other rank never started");
}

std::atomic<bool> g_sigint{false};

int sigint() {
  auto world = dist::world_from_env();
  g_rank = world.rank;
  std::signal(SIGINT, [](int) { g_sigint = true; });
  std::cout << "rank " << g_rank << ": ready" << std::endl;
  for (int i = 0; i < 3000 && !g_sigint; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  expect(g_sigint, "sigint", "no SIGINT within 30 s");
  std::cout << "rank " << g_rank << ": caught SIGINT" << std::endl;
  return 0;
}

// ---------------------------------------------------------------- timing (not a test)

// ms per training step of an MLP (layers x Linear(hidden, hidden)) without DDP and with
// DDP in four variants. Alone (no launcher) DDP runs on the single backend, which isolates what
// the hooks and the set_to_none copies cost; under amplab-run it adds the cpu backend's traffic.
int bench(int64_t hidden, int layers, int steps, int64_t batch) {
  auto comm = connect();
  dist::DistConfig base;
  base.backend = g_nccl ? dist::Backend::nccl : dist::Backend::cpu;
  auto make_model = [&] {
    torch::manual_seed(0);
    torch::nn::Sequential model;
    for (int i = 0; i < layers; ++i) {
      model->push_back(torch::nn::Linear(hidden, hidden));
      model->push_back(torch::nn::Functional(torch::tanh));
    }
    model->to(g_device);
    return model;
  };
  auto x = on_device(torch::randn({batch, hidden})), y = on_device(torch::randn({batch, hidden}));
  auto time_steps = [&](torch::nn::Sequential& model, DistributedDataParallel* ddp, bool set_to_none) {
    torch::optim::SGD optimizer(model->parameters(), 0.01);
    double ms = 0;
    for (int step = -2; step < steps; ++step) {  // two warm-up steps
      synchronize_device();
      comm->barrier();
      auto start = std::chrono::steady_clock::now();
      optimizer.zero_grad(set_to_none);
      if (ddp) ddp->before_forward();
      torch::mse_loss(model->forward(x), y).backward();
      if (ddp) ddp->finish_gradient_sync();
      optimizer.step();
      synchronize_device();
      if (step >= 0) ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    }
    return ms / steps;
  };
  double mb = static_cast<double>(layers * (hidden * hidden + hidden) * 4) / (1 << 20);
  if (g_rank == 0)
    std::cout << "MLP " << layers << " x Linear(" << hidden << "), batch " << batch << " per rank, " << mb << " MiB of gradients, backend "
              << comm->backend() << ", world " << comm->size() << ", " << at::get_num_threads() << " threads" << std::endl;
  {
    auto model = make_model();
    double ms = time_steps(model, nullptr, false);
    if (g_rank == 0) std::cout << "  no DDP (local only)              " << ms << " ms/step" << std::endl;
  }
  for (bool overlap : {true, false}) {
    for (bool set_to_none : {false, true}) {
      auto model = make_model();
      dist::DistConfig config = base;
      config.overlap = overlap;
      DistributedDataParallel ddp(model.ptr(), comm, config);
      double ms = time_steps(model, &ddp, set_to_none);
      if (g_rank == 0)
        std::cout << "  DDP overlap=" << overlap << " set_to_none=" << set_to_none << "   " << ms << " ms/step ("
                  << ddp.stats().grad_copies << " grad copies)" << std::endl;
    }
  }
  comm->shutdown();
  return 0;
}

int run(int argc, char** argv) {
  std::vector<std::string> args;  // the scenario and its arguments, without --nccl
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--nccl") g_nccl = true;
    else args.push_back(argv[i]);
  }
  std::string scenario = args.empty() ? "" : args[0];
  if (scenario == "collectives") return collectives();
  if (scenario == "ddp") return ddp();
  if (scenario == "accumulate") return accumulate();
  if (scenario == "step_each_bucket") return step_each_bucket();
  if (scenario == "unused") return unused();
  if (scenario == "compress") return compress();
  if (scenario == "mismatch") return mismatch();
  auto arg = [&](size_t i, const std::string& fallback) { return args.size() > i ? args[i] : fallback; };
  if (scenario == "die") return die(std::stoi(arg(1, "1")), std::stod(arg(2, "120")));
  if (scenario == "leave") return leave(std::stoi(arg(1, "1")), std::stod(arg(2, "120")));
  if (scenario == "join") return join(std::stod(arg(1, "2")));
  if (scenario == "sigint") return sigint();
  if (scenario == "bench")
    return bench(std::stoll(arg(1, "1024")), std::stoi(arg(2, "4")), std::stoi(arg(3, "20")), std::stoll(arg(4, "64")));
  throw Error("dist_worker: unknown scenario '" + scenario +
              "'; use collectives, ddp, accumulate, step_each_bucket, unused, compress, mismatch, die [rank [timeout_s]], leave [rank [timeout_s]], join [timeout_s], sigint, bench [hidden [layers [steps [batch]]]]; add --nccl for GPUs");
}

}  // namespace

int main(int argc, char** argv) {
  return amplab::guarded_main([&] { return run(argc, argv); });
}
