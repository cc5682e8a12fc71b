// Lab 8, sharded data parallelism: the same model (an MLP, or with model.kind=gpt lab 7's GPT at
// GPT-2's sizes) trained on the same data, first as DDP (the
// gradients all-reduced, every rank stepping the whole model with torch's AdamW), then with your
// ZeRO-1, ZeRO-2 and ZeRO-3 (labs/sharded_training/sharded_training.hpp): the state each rank
// holds against your estimate, the step time, and the losses side by side. Launch with our
// launcher or torchrun:
//   build/bin/amplab-run --nproc-per-node 2 -- build/bin/sharded_training [--set key=value ...]
//   torchrun --standalone --nproc-per-node 2 --no-python build/bin/sharded_training
#include <ATen/record_function.h>
#include <c10/core/AllocatorConfig.h>
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
#include "traffic.hpp"

namespace {

using amplab::decimals;
using zero_lab::TrafficCounter;
using zero_lab::ZeroConfig;
using ZeroLab = amplab::Lab<ZeroConfig>;

// The model, made from run.seed on the CPU (every rank builds the same one), on `device`.
std::shared_ptr<zero_lab::LabModel> make_model(const ZeroConfig& config, torch::Device device) {
  const auto seed = static_cast<uint64_t>(config.run.seed);
  const auto& m = config.model;
  std::shared_ptr<zero_lab::LabModel> model;
  if (m.kind == zero_lab::ModelKind::mlp)
    model = std::make_shared<zero_lab::Mlp>(m.width, m.layers, m.batch, seed);
  else
    model = std::make_shared<zero_lab::Gpt>(zero_lab::GptShape{m.layers, m.width, m.heads, m.context, m.vocab, m.batch}, seed);
  model->to(device);
  return model;
}

// "MLP 4 x Linear(1024)", "GPT 24 blocks x width 1024, 16 heads, context 1024, vocabulary 50304".
std::string model_name(const ZeroConfig& config) {
  const auto& m = config.model;
  if (m.kind == zero_lab::ModelKind::mlp)
    return "MLP " + std::to_string(m.layers) + " x Linear(" + std::to_string(m.width) + ")";
  return "GPT " + std::to_string(m.layers) + " blocks x width " + std::to_string(m.width) + ", " + std::to_string(m.heads) +
         " heads, context " + std::to_string(m.context) + ", vocabulary " + std::to_string(m.vocab);
}

struct StageRun {
  bool out_of_memory = false;  // on some rank, under memory.cap_mib or on a full GPU: nothing else is set
  std::vector<double> losses;  // the mean over ranks, per step
  double step_ms = 0;          // median after train.warmup
  double sent_bytes = 0;       // what this rank sent in a step's collectives (after train.warmup, the mean)
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

// Trains config.train.steps steps of `forward` on `model`'s batches and loss; `step()` is the
// stage's optimizer step after backward.
StageRun train(const ZeroConfig& config, TrafficCounter& comm, const zero_lab::LabModel& model,
               const std::function<torch::Tensor(const torch::Tensor&)>& forward, torch::Device device,
               const std::function<void()>& zero_grad, const std::function<void()>& step) {
  StageRun out;
  std::vector<double> times, sent;
  amplab::DeviceTimer timer(device);
  for (int s = 0; s < config.train.steps; ++s) {
    auto [x, y] = model.batch(static_cast<uint64_t>(config.run.seed), s, comm.rank(), comm.size(), device);
    comm.reset();
    torch::Tensor loss;
    timer.start();
    {
      RECORD_USER_SCOPE("amplab_step");  // the step's bounds in a run.trace trace (bench/trace_steps.py)
      zero_grad();
      loss = model.loss(forward(x), y);
      loss.backward();
      step();
    }
    const double ms = timer.stop_ms();
    if (s >= config.train.warmup) {
      times.push_back(ms);
      sent.push_back(comm.sent());
    }
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
  out.sent_bytes = sent.empty() ? 0 : amplab::summarize(sent).mean;
  return out;
}

std::function<torch::Tensor(const torch::Tensor&)> forward_of(zero_lab::LabModel& model) {
  return [&model](const torch::Tensor& x) { return model.forward(x); };
}

// DDP: every gradient averaged by one all-reduce, then torch's AdamW on the whole model.
StageRun train_ddp(const ZeroConfig& config, TrafficCounter& comm, torch::Device device) {
  amplab::reset_peak_memory(device);
  const amplab::MemoryReading start = amplab::read_memory(device);
  auto model = make_model(config, device);
  torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(config.train.lr)
                                                     .weight_decay(config.train.weight_decay));
  StageRun run = train(config, comm, *model, forward_of(*model), device, [&] { adamw.zero_grad(); }, [&] {
    std::vector<torch::Tensor> grads;
    for (auto& p : model->parameters()) grads.push_back(p.grad());
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
StageRun train_zero1(const ZeroConfig& config, std::shared_ptr<TrafficCounter> comm, torch::Device device) {
  amplab::reset_peak_memory(device);
  const amplab::MemoryReading start = amplab::read_memory(device);
  auto model = make_model(config, device);
  zero_lab::ShardedAdamW adamw(model->parameters(), comm, adamw_options(config));
  StageRun run = train(config, *comm, *model, forward_of(*model), device, [&] { adamw.zero_grad(); }, [&] { adamw.step(); });
  run.state_bytes = adamw.state_bytes();
  measure_memory(run, device, start);
  return run;
}

// ZeRO-2: your ShardedGradientsAdamW, one bucket per unit (a Linear's weight and bias, a block's
// parameters).
StageRun train_zero2(const ZeroConfig& config, std::shared_ptr<TrafficCounter> comm, torch::Device device) {
  amplab::reset_peak_memory(device);
  const amplab::MemoryReading start = amplab::read_memory(device);
  auto model = make_model(config, device);
  std::vector<std::vector<torch::Tensor>> buckets;
  for (const auto& unit : model->units()) buckets.push_back(unit->parameters());
  zero_lab::ShardedGradientsAdamW adamw(buckets, comm, adamw_options(config));
  StageRun run = train(config, *comm, *model, forward_of(*model), device, [&] { adamw.zero_grad(); }, [&] { adamw.step(); });
  run.state_bytes = adamw.state_bytes();
  measure_memory(run, device, start);
  return run;
}

// This rank's training state of a ZeRO-3 model, copied to the CPU: each unit's shard and moments.
std::vector<torch::Tensor> shards_on_cpu(zero_lab::FullyShardedModel& model) {
  std::vector<torch::Tensor> out;
  for (auto& unit : model.units())
    for (const auto& t : {unit.shard.detach(), unit.exp_avg, unit.exp_avg_sq}) out.push_back(t.cpu());
  return out;
}

// Your sharded checkpoint of the trained ZeRO-3 model, saved into `dir` and loaded into a new
// model once the trained one is gone (where one model barely fits, two do not): whether every
// rank's shards, moments and step count came back to the bit, and the bytes of this rank's file.
nlohmann::json checkpoint_round_trip(const ZeroConfig& config, std::shared_ptr<TrafficCounter> comm, torch::Device device,
                                     std::unique_ptr<zero_lab::FullyShardedModel> trained, const std::string& dir) {
  zero_lab::save_sharded(*trained, dir);
  const std::vector<torch::Tensor> saved = shards_on_cpu(*trained);
  const int64_t steps = trained->steps();
  trained.reset();
  zero_lab::FullyShardedModel loaded(make_model(config, device), comm, adamw_options(config));
  zero_lab::load_sharded(loaded, dir);
  const std::vector<torch::Tensor> restored = shards_on_cpu(loaded);
  bool differs = loaded.steps() != steps || restored.size() != saved.size();
  for (size_t i = 0; !differs && i < saved.size(); ++i) differs = !torch::equal(restored[i], saved[i]);
  differs = amplab::dist::loop_hooks(comm).any(differs);
  const std::string mine = dir + "/rank-" + std::to_string(comm->rank()) + "-of-" + std::to_string(comm->size()) + ".safetensors";
  return {{"dir", dir}, {"restored_to_the_bit", !differs}, {"bytes_per_rank", std::filesystem::file_size(mine)}};
}

// ZeRO-3: your FullyShardedModel, each unit gathered for its forward and backward and prefetched
// one unit ahead; then its checkpoint's round trip (with a run directory).
StageRun train_zero3(const ZeroConfig& config, std::shared_ptr<TrafficCounter> comm, torch::Device device,
                     const std::string& checkpoint_dir, nlohmann::json& checkpoint) {
  amplab::reset_peak_memory(device);
  const amplab::MemoryReading start = amplab::read_memory(device);
  const zero_lab::ShardedPrecision precision{zero_lab::ZeroFsdpConfig::scalar_type(config.fsdp.param_dtype),
                                             zero_lab::ZeroFsdpConfig::scalar_type(config.fsdp.reduce_dtype)};
  auto model = std::make_unique<zero_lab::FullyShardedModel>(make_model(config, device), comm, adamw_options(config),
                                                             /*prefetch=*/true, precision);
  // The model is made whole and then cut into shards (FSDP initializes layer by layer, or on the
  // meta device): the peak that matters is training's, from here.
  amplab::reset_peak_memory(device);
  StageRun run = train(
      config, *comm, model->model(), [&](const torch::Tensor& x) { return model->forward(x); }, device,
      [&] { model->zero_grad(); }, [&] { model->step(); });
  run.state_bytes = model->state_bytes();
  measure_memory(run, device, start);
  if (!checkpoint_dir.empty()) checkpoint = checkpoint_round_trip(config, comm, device, std::move(model), checkpoint_dir);
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

// How close the stages' losses came to the first one's that trained (DDP's, unless it ran out of memory).
struct LossAgreement {
  double largest = 0;           // over the stages in fp32, which must give the same losses
  double zero3_difference = 0;  // ZeRO-3's alone (in bf16 it only comes close)
  double tolerance = 0;         // what `largest` may be
  bool compared_zero3 = false;  // whether a stage in fp32 trained, to compare ZeRO-3's losses with
  bool same = false;
};

// The stages' losses are equal to the bit on the cpu backend, where every collective sums in rank
// order and every kernel gives the same bits each time. On GPUs neither is promised: NCCL on more
// than two ranks sums all-reduce and reduce-scatter in different orders, and one H100 run of a
// 537M-parameter MLP on a single rank saw DDP's losses leave ZeRO's by 0.3% within 12 steps.
// AdamW's first step, lr x g / |g| per element, turns a rounding difference on a gradient near
// zero into a whole step the other way: there the losses only stay close.
double loss_tolerance(const std::string& backend) {
  return backend != "nccl" ? 1e-4 : 2e-2;
}

struct StageRow {
  const char* name;
  int stage;  // 0: DDP, 1-3: ZeRO-1 to ZeRO-3
  const StageRun* run;
};

std::vector<StageRow> stage_rows(const ZeroConfig& config, const Stages& st) {
  return {{"ddp", 0, &st.ddp}, {"zero-1", 1, &st.zero1}, {"zero-2", 2, &st.zero2},
          {config.fsdp.fp32() ? "zero-3" : "zero-3 (mixed)", 3, &st.zero3}};
}

// The stages table: the state each stage holds against your estimate, what it sent against the
// formula, its memory, speed and last loss; a stage that ran out of memory keeps its estimates.
void record_stage_table(ZeroLab& lab, const Stages& st, int world, int64_t num_params) {
  const ZeroConfig& config = lab.config;
  const bool gpt = config.model.kind == zero_lab::ModelKind::gpt;
  auto& stages = lab.results.table(
      "stages", {{"stage", "stage"}, {"outcome", "outcome"}, {"state_bytes", "optimizer state (bytes, this rank)", decimals(0)},
                 {"estimate_bytes", "your estimate", decimals(0)}, {"total_estimate_bytes", "params + grads + state", decimals(0)},
                 {"held_bytes", "held (GPU)", decimals(0)}, {"peak_bytes", "peak (GPU)", decimals(0)},
                 {"sent_bytes", "sent (bytes/step)", decimals(0)}, {"expected_sent_bytes", "formula", decimals(0)},
                 {"step_ms", "ms/step", decimals(3)},
                 {"samples_per_s", gpt ? "tokens/s (all ranks)" : "samples/s (all ranks)", decimals(0)},
                 {"final_loss", "final loss", decimals(6)}});
  const int param_bytes = config.fsdp.param_dtype == zero_lab::FsdpDtype::bfloat16 ? 2 : 4;
  const int reduce_bytes = config.fsdp.reduce_dtype == zero_lab::FsdpDtype::bfloat16 ? 2 : 4;
  for (const StageRow& row : stage_rows(config, st)) {
    const auto estimate = zero_lab::estimate_memory(num_params, world, row.stage, /*mixed_precision=*/false);
    const double expected_sent = zero_lab::expected_traffic(row.stage, world, num_params, param_bytes, reduce_bytes,
                                                            config.model.gathered_once());
    const StageRun& r = *row.run;
    if (r.out_of_memory) {
      stages.add({row.name, "out of memory", nullptr, estimate.optimizer_state, estimate.total(), nullptr, nullptr, nullptr,
                  expected_sent, nullptr, nullptr, nullptr});
      continue;
    }
    const int64_t per_row = gpt ? config.model.context : 1;
    const double samples_per_s =
        r.step_ms > 0 ? 1000.0 * static_cast<double>(config.model.batch * per_row * world) / r.step_ms : 0;
    stages.add({row.name, "trained", r.state_bytes, estimate.optimizer_state, estimate.total(), r.held_bytes, r.peak_bytes,
                r.sent_bytes, expected_sent, r.step_ms, samples_per_s, r.losses.back()});
  }
}

// The losses table and the summary's keys; the stages that ran out of memory are left out.
LossAgreement record_stages(ZeroLab& lab, const Stages& st, int world, int64_t num_params, const std::string& backend) {
  const ZeroConfig& config = lab.config;
  record_stage_table(lab, st, world, num_params);
  auto& losses = lab.results.table("losses", {{"step", "step", decimals(0)}, {"ddp", "ddp", decimals(6)},
                                              {"zero_1", "zero-1", decimals(6)}, {"zero_2", "zero-2", decimals(6)},
                                              {"zero_3", "zero-3", decimals(6)}});
  const auto rows = stage_rows(config, st);
  const StageRun* reference = nullptr;
  for (const StageRow& row : rows)
    if (!row.run->out_of_memory && (row.stage < 3 || config.fsdp.fp32()) && !reference) reference = row.run;
  LossAgreement agreement;
  for (int s = 0; s < config.train.steps; ++s) {
    std::vector<nlohmann::json> cells{static_cast<int64_t>(s)};
    for (const StageRow& row : rows) {
      if (row.run->out_of_memory) {
        cells.push_back(nullptr);
        continue;
      }
      const double loss = row.run->losses[s];
      cells.push_back(loss);
      if (!reference) continue;
      const double ref = reference->losses[s];
      const double relative = std::abs(ref - loss) / std::max(std::abs(ref), 1e-12);
      if (row.stage < 3 || config.fsdp.fp32()) agreement.largest = std::max(agreement.largest, relative);
      if (row.stage == 3 && row.run != reference) {
        agreement.zero3_difference = std::max(agreement.zero3_difference, relative);
        agreement.compared_zero3 = true;
      }
    }
    losses.add(cells);
  }
  agreement.tolerance = loss_tolerance(backend);
  agreement.same = agreement.largest <= agreement.tolerance;
  lab.results.set("world_size", world);
  lab.results.set("num_params", num_params);
  lab.results.set("largest_relative_loss_difference", agreement.largest);
  lab.results.set("losses_match", agreement.same);
  lab.results.set("checkpoint", st.checkpoint);
  lab.results.set("memory_cap_mib", config.memory.cap_mib);
  lab.results.set("memory_expandable_segments", config.memory.expandable_segments);
  lab.results.set("fsdp", {{"param_dtype", amplab::enum_to_string(config.fsdp.param_dtype)},
                           {"reduce_dtype", amplab::enum_to_string(config.fsdp.reduce_dtype)},
                           {"largest_relative_loss_difference", agreement.zero3_difference}});
  return agreement;
}

// Rank 0's console: the stages table, whether the losses agree, the checkpoint's round trip.
void print_summary(ZeroLab& lab, const Stages& st, const LossAgreement& agreement, int world, const std::string& backend,
                   int64_t num_params) {
  const ZeroConfig& config = lab.config;
  lab.results.print("stages", "DDP and ZeRO-1, 2 and 3 on " + std::to_string(world) + " rank(s), " + backend + ", " +
                                  model_name(config) + ", " + std::to_string(num_params) + " parameters",
                    "optimizer state: the bytes of AdamW's moments this rank holds; your estimate: estimate_memory's "
                    "optimizer_state (fp32, stage 0 for ddp, 1-3 for zero-1 to zero-3) and its total; held: what the "
                    "CUDA allocator holds for the stage after training (model, gradients, optimizer), peak: its "
                    "largest while training (activations too), both '-' on the CPU; sent: the bytes this rank's "
                    "collectives send in a step (ring algorithms), formula: what they must send for these parameters; "
                    "ms/step: median after " +
                        std::to_string(config.train.warmup) + " steps" +
                        (config.memory.cap_mib > 0 ? "; each rank capped at " + std::to_string(config.memory.cap_mib) + " MiB"
                                                   : std::string()) +
                        (config.memory.expandable_segments ? "; the allocator's segments expandable" : "") +
                        "\n");
  std::cout << "losses of the stages that trained" << (config.fsdp.fp32() ? "" : " (ZeRO-3 apart)") << " "
            << (agreement.same ? "match" : "DIFFER") << " (largest relative difference "
            << amplab::fixed(agreement.largest, 9) << " over " << config.train.steps << " steps; at most "
            << agreement.tolerance << (agreement.tolerance < 1e-3 ? "" : ": GPU kernels and NCCL's sums need not repeat to the bit")
            << ")\n";
  if (!config.fsdp.fp32() && !st.zero3.out_of_memory)
    std::cout << "ZeRO-3 in " << amplab::enum_to_string(config.fsdp.param_dtype) << " (reduced in "
              << amplab::enum_to_string(config.fsdp.reduce_dtype) << "): "
              << (agreement.compared_zero3 ? "largest relative loss difference from the fp32 stages' " +
                                                 amplab::fixed(agreement.zero3_difference, 6)
                                           : std::string("no stage trained in fp32 to compare its losses with"))
              << "\n";
  if (!lab.device.is_cuda())
    std::cout << "skipped on the CPU: the GPU parts (the allocator's held and peak memory, memory.cap_mib, NCCL's "
                 "times); on GPUs: amplab-run --nproc-per-node 2 (then 4) -- build/bin/sharded_training\n";
  if (!st.checkpoint.is_null())
    std::cout << "ZeRO-3's sharded checkpoint: " << world << " file(s) of " << st.checkpoint["bytes_per_rank"].get<int64_t>()
              << " bytes in " << st.checkpoint["dir"].get<std::string>() << "; loaded into a new model: "
              << (st.checkpoint["restored_to_the_bit"].get<bool>() ? "the same bits" : "DIFFERENT values") << "\n";
}

// Runs one stage in its phase. Running out of memory (under memory.cap_mib, or on a full GPU) is
// the stage's outcome, not the run's end: every rank holds the same shapes and so runs out at the
// same allocation; they agree on it, free what the stage held, and go on to the next stage.
StageRun run_stage(ZeroLab& lab, const std::function<bool(bool)>& any_rank, const char* name,
                   const std::function<StageRun()>& stage) {
  lab.phase(name);
  StageRun run;
  std::string out_of_memory;
  try {
    run = stage();
  } catch (const std::exception& error) {
    if (!amplab::is_out_of_memory(error)) throw;
    out_of_memory = amplab::oom_summary(error);
  }
  amplab::free_cached_memory(lab.device);
  if (any_rank(!out_of_memory.empty())) {
    amplab::log::warn(std::string(name) + " ran out of memory" +
                      (out_of_memory.empty() ? " on another rank" : ": " + out_of_memory));
    run = StageRun{};
    run.out_of_memory = true;
  }
  return run;
}

int run_rank(ZeroLab& lab) {
  const ZeroConfig& config = lab.config;
  auto comm = std::make_shared<TrafficCounter>(amplab::dist::make_communicator(lab.world, config.dist, lab.device));
  const auto any_rank = amplab::dist::loop_hooks(comm).any;
  lab.any_rank = any_rank;  // every rank stops before the same stage
  if (config.memory.cap_mib > 0) {
    if (!lab.device.is_cuda())
      throw amplab::Error("memory.cap_mib: " + std::to_string(config.memory.cap_mib) +
                          " MiB caps a GPU's allocator, and this run is on " + lab.device.str() + ": set it to 0");
    amplab::limit_device_memory(lab.device, config.memory.cap_mib * 1024 * 1024);
  }
  if (config.memory.expandable_segments) {
    if (!lab.device.is_cuda())
      throw amplab::Error("memory.expandable_segments: true configures a GPU's allocator, and this run is on " +
                          lab.device.str() + ": set it to false");
    c10::CachingAllocator::setAllocatorSettings("expandable_segments:True");
  }
  const int world = comm->size();
  const int64_t num_params = config.model.parameter_count();
  amplab::log::info(lab.world.describe() + ", " + comm->backend() + "; " + model_name(config) + ", " +
                    std::to_string(num_params) + " parameters");

  // cuBLAS allocates its workspace through the CUDA allocator at the first matmul: here, so that
  // the first stage's memory does not count it.
  torch::mm(torch::ones({8, 8}, lab.device), torch::ones({8, 8}, lab.device));
  Stages st;
  st.ddp = run_stage(lab, any_rank, "ddp", [&] { return train_ddp(config, *comm, lab.device); });
  st.zero1 = run_stage(lab, any_rank, "zero-1", [&] { return train_zero1(config, comm, lab.device); });
  st.zero2 = run_stage(lab, any_rank, "zero-2", [&] { return train_zero2(config, comm, lab.device); });
  const std::string checkpoint_dir = shared_checkpoint_dir(lab, comm);
  st.zero3 = run_stage(lab, any_rank, "zero-3",
                       [&] { return train_zero3(config, comm, lab.device, checkpoint_dir, st.checkpoint); });
  lab.phase("");

  const LossAgreement agreement = record_stages(lab, st, world, num_params, comm->backend());
  lab.results.set("backend", comm->backend());
  const bool restored = st.checkpoint.is_null() || st.checkpoint["restored_to_the_bit"].get<bool>();
  comm->shutdown();
  if (lab.world.is_main()) print_summary(lab, st, agreement, world, comm->backend(), num_params);
  return agreement.same && restored ? amplab::kExitOk : amplab::kExitFailure;
}

}  // namespace

int main(int argc, char** argv) {
  amplab::LabInfo info{.name = amplab::this_lab::kName, .title = amplab::this_lab::kTitle, .accepts_resume = false,
                       .size_keys = "model.width, model.layers, model.batch or model.context", .resume_help = "",
                       .one_process_per_rank = true};
  return amplab::lab_main<ZeroConfig>(argc, argv, info, nullptr, run_rank);
}
