// Lab 8, sharded data parallelism: the same MLP trained on the same data, first as DDP (the
// gradients all-reduced, every rank stepping the whole model with torch's AdamW), then with your
// ZeRO-1, ZeRO-2 and ZeRO-3 (labs/sharded_training/sharded_training.hpp): the state each rank
// holds against your estimate, the step time, and the losses side by side. Launch with our
// launcher or torchrun:
//   build/bin/amplab-run --nproc-per-node 2 -- build/bin/sharded_training [--set key=value ...]
//   torchrun --standalone --nproc-per-node 2 --no-python build/bin/sharded_training
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <functional>

#include "amplab/dist/communicator.hpp"
#include "amplab/dist/trainer_sync.hpp"
#include "amplab/infra/device.hpp"
#include "amplab/infra/log.hpp"
#include "amplab/infra/signals.hpp"
#include "amplab/lab_main.hpp"
#include "amplab/measure/memory.hpp"
#include "amplab/measure/timing.hpp"
#include "amplab/report/table.hpp"
#include "config.hpp"
#include "lab_identity.hpp"  // this_lab: labs/<lab>/lab.yaml
#include "sharded_training.hpp"

namespace {

using amplab::decimals;
using zero_lab::ZeroConfig;
using ZeroLab = amplab::Lab<ZeroConfig>;

// The MLP, made from run.seed: every rank builds the same one (the init runs on the CPU).
torch::nn::Sequential make_mlp(const ZeroConfig& config, torch::Device device) {
  torch::manual_seed(static_cast<uint64_t>(config.run.seed));
  torch::nn::Sequential mlp;
  for (int64_t i = 0; i < config.model.layers; ++i) {
    mlp->push_back(torch::nn::Linear(config.model.width, config.model.width));
    if (i + 1 < config.model.layers) mlp->push_back(torch::nn::ReLU());
  }
  mlp->to(device);
  return mlp;
}

// Step `step`'s data on this rank: its rows of a global batch drawn from run.seed and the step,
// the targets a fixed function of the inputs. Every stage sees the same batches.
std::pair<torch::Tensor, torch::Tensor> batch_of(const ZeroConfig& config, const amplab::dist::Communicator& comm,
                                                 int step, torch::Device device) {
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(config.run.seed) * 1000003 + step);
  const int64_t rows = config.model.batch;
  auto x = at::randn({rows * comm.size(), config.model.width}, gen).narrow(0, rows * comm.rank(), rows);
  auto y = torch::sin(x * 2).roll(1, 1);
  return {x.to(device), y.to(device)};
}

struct StageRun {
  std::vector<double> losses;  // the mean over ranks, per step
  double step_ms = 0;          // median after train.warmup
  int64_t state_bytes = 0;     // optimizer state on this rank
  nlohmann::json held_bytes;   // GPU: what the allocator holds after training (the model, its
                               // gradients, the optimizer); null on the CPU
  nlohmann::json peak_bytes;   // GPU: the allocator's peak while training (activations too)
};

// The allocator's counters since `start`: what the stage holds and its peak (GPU only).
void measure_memory(StageRun& run, torch::Device device, const amplab::MemoryReading& start) {
  if (amplab::memory_is_rss(device)) return;
  const amplab::MemoryReading now = amplab::read_memory(device);
  run.held_bytes = now.allocated - start.allocated;
  run.peak_bytes = now.peak_allocated - start.allocated;
}

// Trains config.train.steps steps of `forward`; `step()` is the stage's optimizer step after backward.
StageRun train(const ZeroConfig& config, amplab::dist::Communicator& comm,
               const std::function<torch::Tensor(const torch::Tensor&)>& forward, torch::Device device,
               const std::function<void()>& zero_grad, const std::function<void()>& step) {
  StageRun out;
  std::vector<double> times;
  amplab::DeviceTimer timer(device);
  for (int s = 0; s < config.train.steps; ++s) {
    auto [x, y] = batch_of(config, comm, s, device);
    timer.start();
    zero_grad();
    auto loss = torch::mse_loss(forward(x), y);
    loss.backward();
    step();
    const double ms = timer.stop_ms();
    if (s >= config.train.warmup) times.push_back(ms);
    // The loss summed over the ranks and whether any rank was asked to stop, in one all-reduce:
    // every rank stops after the same step (a rank that stopped alone would leave the others
    // waiting in the next step's collectives).
    auto shared = torch::tensor({loss.item<double>(), static_cast<double>(amplab::interrupt_signal())}, torch::kFloat64);
    shared = shared.to(device);
    comm.all_reduce_sum({shared})->wait();
    shared = shared.cpu();
    out.losses.push_back(shared[0].item<double>() / comm.size());
    if (shared[1].item<double>() > 0)
      throw amplab::Interrupted(amplab::interrupt_requested() ? amplab::interrupt_signal() : SIGINT);
  }
  out.step_ms = times.empty() ? 0 : amplab::summarize(times).median;
  return out;
}

std::function<torch::Tensor(const torch::Tensor&)> forward_of(torch::nn::Sequential& mlp) {
  return [&mlp](const torch::Tensor& x) { return mlp->forward(x); };
}

// DDP: every gradient averaged by one all-reduce, then torch's AdamW on the whole model.
StageRun train_ddp(const ZeroConfig& config, amplab::dist::Communicator& comm, torch::Device device) {
  amplab::reset_peak_memory(device);
  const amplab::MemoryReading start = amplab::read_memory(device);
  auto mlp = make_mlp(config, device);
  torch::optim::AdamW adamw(mlp->parameters(), torch::optim::AdamWOptions(config.train.lr)
                                                   .weight_decay(config.train.weight_decay));
  StageRun run = train(config, comm, forward_of(mlp), device, [&] { adamw.zero_grad(); }, [&] {
    std::vector<torch::Tensor> grads;
    for (auto& p : mlp->parameters()) grads.push_back(p.grad());
    comm.all_reduce_mean(grads)->wait();
    adamw.step();
  });
  for (const auto& [key, state] : adamw.state()) {
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*state);
    run.state_bytes += s.exp_avg().nbytes() + s.exp_avg_sq().nbytes();
  }
  measure_memory(run, device, start);
  return run;
}

zero_lab::AdamWOptions adamw_options(const ZeroConfig& config) {
  zero_lab::AdamWOptions options;
  options.lr = config.train.lr;
  options.weight_decay = config.train.weight_decay;
  return options;
}

// ZeRO-1: your ShardedAdamW.
StageRun train_zero1(const ZeroConfig& config, std::shared_ptr<amplab::dist::Communicator> comm, torch::Device device) {
  amplab::reset_peak_memory(device);
  const amplab::MemoryReading start = amplab::read_memory(device);
  auto mlp = make_mlp(config, device);
  zero_lab::ShardedAdamW adamw(mlp->parameters(), comm, adamw_options(config));
  StageRun run = train(config, *comm, forward_of(mlp), device, [&] { adamw.zero_grad(); }, [&] { adamw.step(); });
  run.state_bytes = adamw.state_bytes();
  measure_memory(run, device, start);
  return run;
}

// ZeRO-2: your ShardedGradientsAdamW, one bucket per Linear layer (its weight and bias).
StageRun train_zero2(const ZeroConfig& config, std::shared_ptr<amplab::dist::Communicator> comm, torch::Device device) {
  amplab::reset_peak_memory(device);
  const amplab::MemoryReading start = amplab::read_memory(device);
  auto mlp = make_mlp(config, device);
  std::vector<std::vector<torch::Tensor>> buckets;
  for (const auto& layer : mlp->children())
    if (auto params = layer->parameters(); !params.empty()) buckets.push_back(params);
  zero_lab::ShardedGradientsAdamW adamw(buckets, comm, adamw_options(config));
  StageRun run = train(config, *comm, forward_of(mlp), device, [&] { adamw.zero_grad(); }, [&] { adamw.step(); });
  run.state_bytes = adamw.state_bytes();
  measure_memory(run, device, start);
  return run;
}

// ZeRO-3: your FullyShardedMlp, one unit per Linear layer, each gathered for its forward and
// backward and prefetched one layer ahead.
// Your sharded checkpoint of the trained ZeRO-3 model, saved into `dir` and loaded into a new
// model: whether its parameters and moments came back to the bit, and the bytes of this rank's file.
nlohmann::json checkpoint_round_trip(const ZeroConfig& config, std::shared_ptr<amplab::dist::Communicator> comm,
                                     torch::Device device, zero_lab::FullyShardedMlp& trained, const std::string& dir) {
  zero_lab::save_sharded(trained, dir);
  zero_lab::FullyShardedMlp loaded(make_mlp(config, device), comm, adamw_options(config));
  zero_lab::load_sharded(loaded, dir);
  bool same = loaded.steps() == trained.steps() && torch::equal(loaded.full_parameters(), trained.full_parameters());
  for (size_t u = 0; u < trained.units().size(); ++u)
    same = same && torch::equal(loaded.units()[u].exp_avg, trained.units()[u].exp_avg) &&
           torch::equal(loaded.units()[u].exp_avg_sq, trained.units()[u].exp_avg_sq);
  const std::string mine = dir + "/rank-" + std::to_string(comm->rank()) + "-of-" + std::to_string(comm->size()) + ".safetensors";
  return {{"dir", dir}, {"restored_to_the_bit", same}, {"bytes_per_rank", std::filesystem::file_size(mine)}};
}

StageRun train_zero3(const ZeroConfig& config, std::shared_ptr<amplab::dist::Communicator> comm, torch::Device device,
                     const std::string& checkpoint_dir, nlohmann::json& checkpoint) {
  amplab::reset_peak_memory(device);
  const amplab::MemoryReading start = amplab::read_memory(device);
  const zero_lab::ShardedPrecision precision{zero_lab::ZeroFsdpConfig::scalar_type(config.fsdp.param_dtype),
                                             zero_lab::ZeroFsdpConfig::scalar_type(config.fsdp.reduce_dtype)};
  zero_lab::FullyShardedMlp model(make_mlp(config, device), comm, adamw_options(config), /*prefetch=*/true, precision);
  // The model is made whole and then cut into shards (FSDP initializes layer by layer, or on the
  // meta device): the peak that matters is training's, from here.
  amplab::reset_peak_memory(device);
  StageRun run = train(
      config, *comm, [&](const torch::Tensor& x) { return model.forward(x); }, device, [&] { model.zero_grad(); },
      [&] { model.step(); });
  run.state_bytes = model.state_bytes();
  measure_memory(run, device, start);
  if (!checkpoint_dir.empty()) checkpoint = checkpoint_round_trip(config, comm, device, model, checkpoint_dir);
  return run;
}

// Rank 0's run directory for ZeRO-3's checkpoint, on every rank ("" without a run directory):
// each rank writes its part there (one machine, or a file system the ranks share).
std::string shared_checkpoint_dir(ZeroLab& lab, const std::shared_ptr<amplab::dist::Communicator>& comm) {
  const std::string dir =
      amplab::dist::loop_hooks(comm).from_main(lab.run.enabled() ? lab.run.file("zero3-checkpoint") : std::string());
  if (!dir.empty() && lab.world.is_main()) std::filesystem::create_directories(dir);
  comm->barrier();
  return dir;
}

struct Stages {
  StageRun ddp, zero1, zero2, zero3;
  nlohmann::json checkpoint;  // ZeRO-3's checkpoint round trip (null without a run directory)
};

// How close the sharded stages' losses came to DDP's.
struct LossAgreement {
  double largest = 0;           // over the stages in fp32, which must give DDP's losses
  double zero3_difference = 0;  // ZeRO-3's alone (in bf16 it only comes close)
  bool same = false;
};

// The stages and losses tables, and the summary's keys.
LossAgreement record_stages(ZeroLab& lab, const Stages& st, int world, int64_t num_params) {
  const ZeroConfig& config = lab.config;
  auto& stages = lab.results.table(
      "stages", {{"stage", "stage"}, {"state_bytes", "optimizer state (bytes, this rank)", decimals(0)},
                 {"estimate_bytes", "your estimate", decimals(0)}, {"total_estimate_bytes", "params + grads + state", decimals(0)},
                 {"held_bytes", "held (GPU)", decimals(0)}, {"peak_bytes", "peak (GPU)", decimals(0)},
                 {"step_ms", "ms/step", decimals(3)}, {"final_loss", "final loss", decimals(6)}});
  const std::pair<const char*, const StageRun*> rows[] = {
      {"ddp", &st.ddp}, {"zero-1", &st.zero1}, {"zero-2", &st.zero2},
      {config.fsdp.fp32() ? "zero-3" : "zero-3 (mixed)", &st.zero3}};
  for (int stage = 0; stage < 4; ++stage) {
    const auto estimate = zero_lab::estimate_memory(num_params, world, stage, /*mixed_precision=*/false);
    const StageRun& r = *rows[stage].second;
    stages.add({rows[stage].first, r.state_bytes, estimate.optimizer_state, estimate.total(), r.held_bytes, r.peak_bytes,
                r.step_ms, r.losses.back()});
  }
  auto& losses = lab.results.table("losses", {{"step", "step", decimals(0)}, {"ddp", "ddp", decimals(6)},
                                              {"zero_1", "zero-1", decimals(6)}, {"zero_2", "zero-2", decimals(6)},
                                              {"zero_3", "zero-3", decimals(6)}});
  LossAgreement agreement;
  const auto& ddp = st.ddp.losses;
  for (size_t s = 0; s < ddp.size(); ++s) {
    losses.add({static_cast<int64_t>(s), ddp[s], st.zero1.losses[s], st.zero2.losses[s], st.zero3.losses[s]});
    auto relative = [&](const StageRun& r) { return std::abs(ddp[s] - r.losses[s]) / std::max(std::abs(ddp[s]), 1e-12); };
    agreement.largest = std::max({agreement.largest, relative(st.zero1), relative(st.zero2),
                                  config.fsdp.fp32() ? relative(st.zero3) : 0.0});
    agreement.zero3_difference = std::max(agreement.zero3_difference, relative(st.zero3));
  }
  agreement.same = agreement.largest <= 1e-4;
  lab.results.set("world_size", world);
  lab.results.set("num_params", num_params);
  lab.results.set("largest_relative_loss_difference", agreement.largest);
  lab.results.set("losses_match", agreement.same);
  lab.results.set("checkpoint", st.checkpoint);
  lab.results.set("fsdp", {{"param_dtype", amplab::enum_to_string(config.fsdp.param_dtype)},
                           {"reduce_dtype", amplab::enum_to_string(config.fsdp.reduce_dtype)},
                           {"largest_relative_loss_difference", agreement.zero3_difference}});
  return agreement;
}

// Rank 0's console: the stages table, whether the losses agree, the checkpoint's round trip.
void print_summary(ZeroLab& lab, const Stages& st, const LossAgreement& agreement, int world, const std::string& backend,
                   int64_t num_params) {
  const ZeroConfig& config = lab.config;
  lab.results.print("stages", "DDP and ZeRO-1, 2 and 3 on " + std::to_string(world) + " rank(s), " + backend + ", MLP " +
                                  std::to_string(config.model.layers) + " x Linear(" + std::to_string(config.model.width) +
                                  "), " + std::to_string(num_params) + " parameters",
                    "optimizer state: the bytes of AdamW's moments this rank holds; your estimate: estimate_memory's "
                    "optimizer_state (fp32, stage 0 for ddp, 1-3 for zero-1 to zero-3) and its total; held: what the "
                    "CUDA allocator holds for the stage after training (model, gradients, optimizer), peak: its "
                    "largest while training (activations too), both '-' on the CPU; ms/step: median after " +
                        std::to_string(config.train.warmup) + " steps\n");
  std::cout << "losses of " << (config.fsdp.fp32() ? "ZeRO-1, 2, 3" : "ZeRO-1, 2") << " and DDP "
            << (agreement.same ? "match" : "DIFFER") << " (largest relative difference "
            << amplab::fixed(agreement.largest, 9) << " over " << st.ddp.losses.size() << " steps)\n";
  if (!config.fsdp.fp32())
    std::cout << "ZeRO-3 in " << amplab::enum_to_string(config.fsdp.param_dtype) << " (reduced in "
              << amplab::enum_to_string(config.fsdp.reduce_dtype) << "): largest relative loss difference from DDP's fp32 "
              << amplab::fixed(agreement.zero3_difference, 6) << "\n";
  if (!st.checkpoint.is_null())
    std::cout << "ZeRO-3's sharded checkpoint: " << world << " file(s) of " << st.checkpoint["bytes_per_rank"].get<int64_t>()
              << " bytes in " << st.checkpoint["dir"].get<std::string>() << "; loaded into a new model: "
              << (st.checkpoint["restored_to_the_bit"].get<bool>() ? "the same bits" : "DIFFERENT values") << "\n";
}

int run_rank(ZeroLab& lab) {
  const ZeroConfig& config = lab.config;
  auto comm = amplab::dist::make_communicator(lab.world, config.dist, lab.device);
  lab.any_rank = amplab::dist::loop_hooks(comm).any;  // every rank stops before the same stage
  const int world = comm->size();
  const int64_t width = config.model.width, num_params = config.model.layers * (width * width + width);
  amplab::log::info(lab.world.describe() + ", " + comm->backend() + "; the MLP has " + std::to_string(num_params) +
                    " parameters");

  // cuBLAS allocates its workspace through the CUDA allocator at the first matmul: here, so that
  // the first stage's memory does not count it.
  torch::mm(torch::ones({8, 8}, lab.device), torch::ones({8, 8}, lab.device));
  Stages st;
  lab.phase("ddp");
  st.ddp = train_ddp(config, *comm, lab.device);
  lab.phase("zero-1");
  st.zero1 = train_zero1(config, comm, lab.device);
  lab.phase("zero-2");
  st.zero2 = train_zero2(config, comm, lab.device);
  lab.phase("zero-3");
  st.zero3 = train_zero3(config, comm, lab.device, shared_checkpoint_dir(lab, comm), st.checkpoint);
  lab.phase("");

  const LossAgreement agreement = record_stages(lab, st, world, num_params);
  lab.results.set("backend", comm->backend());
  const bool restored = st.checkpoint.is_null() || st.checkpoint["restored_to_the_bit"].get<bool>();
  comm->shutdown();
  if (lab.world.is_main()) print_summary(lab, st, agreement, world, comm->backend(), num_params);
  return agreement.same && restored ? amplab::kExitOk : amplab::kExitFailure;
}

}  // namespace

int main(int argc, char** argv) {
  amplab::LabInfo info{.name = amplab::this_lab::kName, .title = amplab::this_lab::kTitle, .accepts_resume = false,
                       .size_keys = "model.width, model.layers or model.batch", .resume_help = "",
                       .one_process_per_rank = true};
  return amplab::lab_main<ZeroConfig>(argc, argv, info, nullptr, run_rank);
}
