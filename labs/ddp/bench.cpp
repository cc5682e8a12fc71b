// The MLP step benchmark of bench.enabled (bench.hpp): given, no TODOs.
#include "bench.hpp"

#include <filesystem>

#include "amplab/infra/app.hpp"
#include "amplab/infra/device.hpp"
#include "amplab/infra/log.hpp"
#include "amplab/measure/gpu_monitor.hpp"
#include "amplab/measure/timing.hpp"
#include "amplab/models/models.hpp"
#include "amplab/report/table.hpp"
#include "amplab/train/trainer.hpp"
#include "phase_marks.hpp"  // the bench's phases
#include "timeline.hpp"     // bench.trace

namespace ddp_lab {
namespace {

// A GPU reading for the run's summary.json (null without one).
nlohmann::json to_json(const std::optional<amplab::GpuReading>& r) {
  if (!r) return nullptr;
  return {{"sm_mhz", r->sm_mhz}, {"watts", r->watts}, {"power_capped_fraction", r->power_capped}, {"samples", r->samples}};
}

// Every rank's reading of its own GPU, in rank order (a collective: every rank calls it), so
// that a GPU slower than the others shows.
nlohmann::json readings_of_all_ranks(amplab::dist::Communicator& comm, const std::optional<amplab::GpuReading>& mine) {
  nlohmann::json all = nlohmann::json::array();
  for (const auto& text : comm.all_gather_bytes(to_json(mine).dump())) all.push_back(nlohmann::json::parse(text));
  return all;
}

// One value per rank, "1575/1580 MHz"; "-" where no rank has a reading (CPU, no driver).
std::string per_rank(const nlohmann::json& readings, const char* key, double scale, const std::string& unit) {
  std::string cell;
  bool any = false;
  for (const auto& r : readings) {
    if (!cell.empty()) cell += "/";
    any = any || !r.is_null();
    cell += r.is_null() ? "-" : amplab::fixed(scale * r[key].get<double>(), 0);
  }
  return any ? cell + unit : "-";
}

// One row of the bench: the plain MLP alone, or a version of gradient synchronization.
struct BenchSetting {
  std::string name;
  bool alone = false;                           // no DDP, no communication
  SyncKind sync = SyncKind::bucketed;
  bool overlap = true;                          // else dist.overlap = false
  bool step_each_bucket = true;                 // else one optimizer step after the sync
  bool bf16_gradients = false;                  // else dist.compression as configured
  int64_t first_layer_pieces = 1;
  int64_t width = 0;                            // the MLP's width; 0: bench.width
  double bucket_mb = 0;                         // the bucket cap; 0: dist.bucket_mb
  bool traced = true;                           // with bench.trace (the bucket sweep's rows are not)
};

// The rows bench.settings names, after the plain MLP alone (the baseline of every efficiency):
// your four steps (one optimizer step after the sync), the bucketed one with the reference's
// settings (each bucket stepped as soon as it is reduced), without overlap, with bf16 gradients,
// and with the first layer in pieces (alone and bucketed).
std::vector<BenchSetting> bench_settings(const DdpConfig& config) {
  const auto& b = config.bench;
  auto wanted = [&](const std::string& key) { return std::ranges::find(b.settings, key) != b.settings.end(); };
  std::vector<BenchSetting> settings = {{.name = "alone", .alone = true}};
  for (auto [key, kind] : {std::pair{"naive", SyncKind::naive}, std::pair{"flat", SyncKind::flat},
                           std::pair{"overlapped", SyncKind::overlapped},
                           std::pair{"bucketed", SyncKind::bucketed}})
    if (wanted(key)) settings.push_back({.name = key, .sync = kind, .step_each_bucket = false});
  if (wanted("bucketed_fast")) settings.push_back({.name = "bucketed, each bucket stepped (the reference's settings)"});
  if (wanted("bucketed_no_overlap")) settings.push_back({.name = "bucketed, no overlap", .overlap = false});
  if (wanted("bucketed_bf16") && config.dist.compression == amplab::dist::Compression::none)
    settings.push_back({.name = "bucketed, each bucket stepped, bf16 gradients", .bf16_gradients = true});
  if (wanted("pieces") && b.first_layer_pieces > 1) {
    const std::string in_pieces = "first layer in " + std::to_string(b.first_layer_pieces) + " pieces";
    settings.push_back({.name = "alone, " + in_pieces, .alone = true, .first_layer_pieces = b.first_layer_pieces});
    settings.push_back({.name = "bucketed, each bucket stepped, " + in_pieces, .first_layer_pieces = b.first_layer_pieces});
  }
  return settings;
}

// What one setting measured.
struct BenchTimes {
  amplab::Summary each;                    // ms of each step, timed by itself
  std::vector<double> phases;              // their forward, backward, after backward (medians, ms)
  double back_to_back = 0;                 // ms/step, steps queued without waiting
  std::vector<double> back_to_back_phases;  // the last back-to-back window's
  nlohmann::json gpu, gpu_back_to_back;    // every rank's GPU reading while timing
  nlohmann::json ranks_agree;              // every rank's parameters the same after the timed steps (null: alone)
  int64_t buckets = 0;                     // the buckets the sync made (bucketed only)
};

// bench.trace: the profiler's traces of `step` (waited for, then back to back) and two more
// steps on the timeline, every rank's in one file, into `trace_dir` ("": the steps only).
void trace_setting(const std::string& setting, const std::function<void()>& step, const Setup& setup,
                   const std::string& trace_dir, Timeline& timeline, TimelineCommunicator* timeline_comm) {
  // The setting's name as a file name: "bucketed, no overlap" -> "bucketed_no_overlap".
  std::string key;
  for (char c : setting.substr(0, setting.find(" ("))) {
    if (std::isalnum(static_cast<unsigned char>(c))) key += c;
    else if (!key.empty() && key.back() != '_') key += '_';
  }
  for (bool back_to_back : {false, true}) {
    std::string name = "trace_" + key + (back_to_back ? "_back_to_back" : "") +
                       (setup.world.rank > 0 ? "_rank" + std::to_string(setup.world.rank) : "") + ".json";
    trace_steps(step, setup.device, trace_dir.empty() ? std::string() : trace_dir + "/" + name, back_to_back);
  }
  setup.comm->barrier();
  timeline.set_recording(true);
  for (int i = 0; i < 2; ++i) {
    step();
    amplab::synchronize(setup.device);
  }
  timeline.set_recording(false);
  if (timeline_comm) timeline_comm->flush();
  timeline.write_all_ranks(*setup.comm, setup.world.is_main() && !trace_dir.empty() ? trace_dir + "/timeline_" + key + ".json" : "");
}

// Times the MLP's step under one setting: each step by itself, then back to back.
BenchTimes time_setting(const BenchSetting& setting, const DdpConfig& config, const Setup& setup,
                        amplab::GpuMonitor& monitor, const std::string& trace_dir, Timeline& timeline,
                        const amplab::OptimizerFactory& fused_optimizer) {
  const auto& b = config.bench;
  const int64_t width = setting.width > 0 ? setting.width : b.width;
  torch::manual_seed(0);
  auto mlp = amplab::make_mlp(width, b.layers, setting.first_layer_pieces);
  amplab::dist::DistConfig dist_config = config.dist;
  if (setting.bucket_mb > 0) dist_config.bucket_mb = setting.bucket_mb;
  dist_config.overlap = setting.overlap;
  dist_config.step_each_bucket = setting.step_each_bucket;
  if (setting.bf16_gradients) dist_config.compression = amplab::dist::Compression::bf16;
  // With bench.trace, the sync talks through a communicator that puts its all-reduces on the timeline.
  Setup traced = setup;
  std::shared_ptr<TimelineCommunicator> timeline_comm;
  if (b.trace && !setting.alone) traced.comm = timeline_comm = std::make_shared<TimelineCommunicator>(setup.comm, timeline);
  std::unique_ptr<DataParallel> sync;
  if (setting.alone) mlp->to(setup.device);
  else sync = make_gradient_sync(setting.sync, mlp.ptr(), traced, dist_config);
  amplab::TrainConfig train;
  train.precision = b.precision;
  train.fast_path = true;  // fused SGD: what bucketed_fast steps bucket by bucket
  train.optimizer.lr = 1e-4;
  amplab::MemoryConfig memory;
  memory.track = false;
  // The sum of the outputs over the batch, accumulated in fp32 outside autocast: the cheapest
  // loss that trains every layer (bench/ddp_reference.py times the same one in Python).
  auto loss_fn = [&](const amplab::Batch& batch) {
    torch::Tensor out = mlp->forward(batch.input);
    amplab::AutocastGuard off(setup.device, amplab::Precision::fp32);
    return out.sum(torch::kFloat32) / static_cast<double>(b.batch);
  };
  amplab::Trainer trainer(mlp.ptr(), loss_fn, train, setup.device, memory, fused_optimizer);
  PhaseMarks phases(sync.get(), setup.device, static_cast<size_t>(b.steps), &timeline);
  trainer.set_gradient_sync(&phases);
  // Each rank its own batch, as in data-parallel training: a sync that averaged nothing would
  // leave the ranks' parameters apart, which the check after the timing sees.
  torch::manual_seed(1 + setup.world.rank);
  amplab::Batch batch{torch::randn({b.batch, width}, setup.device), torch::zeros({b.batch}, setup.device)};
  auto step = [&] {
    phases.start_step();
    trainer.step(batch);
    phases.end_step();
  };
  setup.comm->barrier();
  amplab::log::info("bench: " + setting.name + ": timing each step");
  monitor.start();
  for (int i = 0; i < b.warmup; ++i) step();
  amplab::synchronize(setup.device);
  std::vector<double> times;
  amplab::DeviceTimer timer(setup.device);
  for (int i = 0; i < b.steps; ++i) {
    timer.start();
    step();
    times.push_back(timer.stop_ms());
  }
  BenchTimes t;
  t.gpu = readings_of_all_ranks(*setup.comm, monitor.stop());
  t.each = amplab::summarize(times);
  t.phases = phases.medians();
  if (b.trace && setting.traced) trace_setting(setting.name, step, setup, trace_dir, timeline, timeline_comm.get());
  // Back to back, as a training loop runs: no wait between steps, so the ranks stay in step
  // through their all-reduces instead of each starting a step when its own host wakes up.
  setup.comm->barrier();
  amplab::log::info("bench: " + setting.name + ": timing steps back to back");
  monitor.start();
  t.back_to_back = amplab::summarize(amplab::time_back_to_back(step, setup.device, b.steps, 3)).median;
  t.gpu_back_to_back = readings_of_all_ranks(*setup.comm, monitor.stop());
  t.back_to_back_phases = phases.medians();  // the last window's steps
  if (!setting.alone) t.ranks_agree = check_parameters_identical(*setup.comm, *mlp).identical;
  if (auto* bucketed = dynamic_cast<BucketedDdp*>(sync.get())) t.buckets = static_cast<int64_t>(bucketed->bucket_layout().size());
  return t;
}

// bench.bucket_sweep_mb: the plain MLP of bench.bucket_sweep_width alone, then bucketed (one
// optimizer step after the sync, as the bench's `bucketed` row) with each cap, into
// bucket_sweep.csv: how many buckets the sync made of the MLP at each cap, and what each cost.
void run_bucket_sweep(const DdpConfig& config, const Setup& setup, amplab::GpuMonitor& monitor, Timeline& timeline,
                      amplab::Results& results,
                      const amplab::OptimizerFactory& fused_optimizer) {
  const auto& b = config.bench;
  const auto ms2 = amplab::decimals(2);
  auto& table = results.table("bucket_sweep", {{"bucket_mb", "dist.bucket_mb", amplab::decimals(0)},
                                               {"buckets", "buckets", amplab::decimals(0)}, {"step_ms", "ms/step", ms2},
                                               {"efficiency", "efficiency", amplab::percent_of_one(1)},
                                               {"exposed_allreduce_ms", "exposed (ms)", ms2}, {"backward_ms", "backward", ms2},
                                               {"after_backward_ms", "after backward", ms2},
                                               {"back_to_back_step_ms", "back-to-back ms/step", ms2},
                                               {"ranks_agree", "same parameters on every rank"}});
  const std::string mlp = std::to_string(b.layers) + " x Linear(" + std::to_string(b.bucket_sweep_width) + ")";
  const BenchTimes alone = time_setting({.name = "alone, " + mlp, .alone = true, .width = b.bucket_sweep_width, .traced = false},
                                        config, setup, monitor, "", timeline, fused_optimizer);
  table.add({nlohmann::json(), nlohmann::json(), alone.each.median, 1.0, nlohmann::json(), alone.phases[1], alone.phases[2],
             alone.back_to_back, nlohmann::json()});
  for (const int64_t cap : b.bucket_sweep_mb) {
    const BenchSetting setting{.name = "bucketed, " + mlp + ", " + std::to_string(cap) + " MiB buckets",
                               .step_each_bucket = false, .width = b.bucket_sweep_width,
                               .bucket_mb = static_cast<double>(cap), .traced = false};
    const BenchTimes t = time_setting(setting, config, setup, monitor, "", timeline, fused_optimizer);
    table.add({cap, t.buckets, t.each.median, alone.each.median / t.each.median, t.each.median - alone.each.median,
               t.phases[1], t.phases[2], t.back_to_back, t.ranks_agree});
  }
}

}  // namespace

int run_bench(const DdpConfig& config, const Setup& setup, const amplab::RunDir& run, amplab::Results& results,
              const amplab::OptimizerFactory& fused_optimizer) {
  const auto& b = config.bench;
  const auto& world = setup.world;
  amplab::GpuMonitor monitor(setup.device);  // this rank's GPU: its clock and power during the timing (all ranks' shown)
  // bench.trace: every rank writes its trace into rank 0's run directory, where that directory
  // is on this machine too.
  std::string trace_dir = b.trace ? setup.comm->all_gather_bytes(run.enabled() ? run.path() : "")[0] : "";
  if (!trace_dir.empty() && !std::filesystem::is_directory(trace_dir)) trace_dir.clear();
  Timeline timeline;
  const std::vector<BenchSetting> settings = bench_settings(config);
  const auto ms2 = amplab::decimals(2);
  results.table("bench", {{"setting", "setting"}, {"step_ms", "ms/step", ms2}, {"iqr_ms", "IQR", ms2},
                          {"efficiency", "efficiency", amplab::percent_of_one(1)}, {"exposed_allreduce_ms", "exposed (ms)", ms2},
                          {"forward_ms", "forward", ms2}, {"backward_ms", "backward", ms2}, {"after_backward_ms", "after backward", ms2},
                          {"back_to_back_step_ms", "back-to-back ms/step", ms2},
                          {"back_to_back_efficiency", "efficiency", amplab::percent_of_one(1)},
                          {"samples_per_s", "samples/s (all ranks)", amplab::decimals(0)}, {"sm_clock", "SM clock"},
                          {"ranks_agree", "same parameters on every rank"}});
  results.table("back_to_back", {{"setting", "setting (back to back)"}, {"forward_ms", "forward", ms2}, {"backward_ms", "backward", ms2},
                                 {"after_backward_ms", "after backward", ms2}, {"step_ms", "ms/step", ms2},
                                 {"sm_clock", "SM clock"}, {"power", "power"}, {"power_capped", "power-capped"}});
  nlohmann::json readings = nlohmann::json::array();  // every rank's GPU while timing, where the tables show medians
  BenchTimes alone;                                   // the first setting's: the plain MLP alone
  for (const BenchSetting& setting : settings) {
    const BenchTimes t = time_setting(setting, config, setup, monitor, trace_dir, timeline, fused_optimizer);
    if (&setting == &settings.front()) alone = t;
    const auto& p = t.phases;
    const auto& q = t.back_to_back_phases;
    const auto& g = t.gpu_back_to_back;
    results.table("bench").add(
        {setting.name, t.each.median, t.each.iqr, alone.each.median / t.each.median,
         setting.alone ? nlohmann::json() : nlohmann::json(t.each.median - alone.each.median), p[0], p[1], p[2],
         t.back_to_back, alone.back_to_back / t.back_to_back,
         static_cast<double>(b.batch * world.world_size) / (t.back_to_back / 1e3), per_rank(t.gpu, "sm_mhz", 1, " MHz"),
         t.ranks_agree});
    results.table("back_to_back").add({setting.name, q[0], q[1], q[2], t.back_to_back, per_rank(g, "sm_mhz", 1, " MHz"),
                                       per_rank(g, "watts", 1, " W"), per_rank(g, "power_capped_fraction", 100, "%")});
    readings.push_back({{"setting", setting.name}, {"each", t.gpu}, {"back_to_back", g}});
  }
  if (!b.bucket_sweep_mb.empty()) run_bucket_sweep(config, setup, monitor, timeline, results, fused_optimizer);
  results.set("gpu_per_rank", readings);
  results.set("world_size", world.world_size);
  results.set("backend", setup.comm->backend());
  if (!world.is_main()) return amplab::kExitOk;
  results.print("bench",
                "MLP " + std::to_string(b.layers) + " x Linear(" + std::to_string(b.width) + ", " + std::to_string(b.width) +
                    "), batch " + std::to_string(b.batch) + " per rank, " + amplab::to_string(b.precision) + ", " +
                    std::to_string(world.world_size) + " rank(s), " + setup.comm->backend(),
                "ms/step: median of " + std::to_string(b.steps) +
                    " steps, each timed alone (waiting for the GPU before the next); efficiency = time alone (the plain "
                    "MLP) / time of the setting; exposed = the time DDP adds to a step; forward, backward and after "
                    "backward (optimizer step + all-reduces still running): medians of each phase (ms); back-to-back: " +
                    std::to_string(b.steps) + " steps queued without waiting, as a training loop runs (median of 3 runs)\n");
  results.print("back_to_back", "The phases of the last back-to-back run's steps",
                "the phases of the last back-to-back run's steps (medians, ms); a step's time beyond their sum is the "
                "gap between steps. SM clock and power: each rank's GPU (rank 0/rank 1/...), medians of NVML samples "
                "every 10 ms while timing; power-capped: the share of samples in which the power cap held the clock down\n");
  if (!b.bucket_sweep_mb.empty())
    results.print("bucket_sweep",
                  "Bucket caps: MLP " + std::to_string(b.layers) + " x Linear(" + std::to_string(b.bucket_sweep_width) +
                      "), batch " + std::to_string(b.batch) + " per rank, bucketed with one optimizer step after the sync",
                  "the first row is that MLP alone: efficiency and exposed (ms) are against it; buckets: how many your "
                  "build_buckets made of the MLP's parameters at that cap\n");
  return amplab::kExitOk;
}


}  // namespace ddp_lab
