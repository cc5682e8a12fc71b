// Lab 3, memory optimization: where the memory of a training step goes and the four levers that
// cut it, measured on a deep residual MLP whose activations dominate (24 blocks of a
// transformer's MLP, width 512, on a GPU).
//   1. memory (peak allocated, peak reserved) and throughput per batch size, for fp32, fp16-mixed
//      and bf16-mixed, with and without activation checkpointing, under a memory cap;
//   2. your batch-size finder: the largest batch that fits and the fastest one (optionally checked
//      by brute force);
//   3. gradient accumulation to an effective batch several times the largest that fits, against
//      the big batch itself (cap lifted): the same loss curve;
//   4. activation checkpointing: memory saved and time paid, per precision;
//   5. a memory timeline of one step, forward/backward/optimizer, with and without checkpointing.
//   build/bin/memory_optimization [--config configs/memory_optimization.yaml] [--set key=value ...]
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <optional>

#include "amplab/infra/app.hpp"
#include "amplab/state/training_snapshot.hpp"
#include "amplab/infra/device.hpp"
#include "amplab/measure/fits.hpp"
#include "amplab/infra/log.hpp"
#include "amplab/measure/memory.hpp"
#include "amplab/report/plots.hpp"
#include "amplab/train/precision.hpp"
#include "amplab/report/report.hpp"
#include "amplab/report/run_dir.hpp"
#include "amplab/report/table.hpp"
#include "amplab/measure/timing.hpp"
#include "amplab/train/trainer.hpp"
#include "mechanisms.hpp"
#include "memory_optimization.hpp"

namespace {

namespace mo = memory_optimization;
using amplab::Precision;
using amplab::Range;

// ---- Config -----------------------------------------------------------------------------------

struct ModelConfig {
  int64_t width = 512;     // residual stream features
  int64_t depth = 24;      // residual blocks
  int64_t expansion = 4;   // hidden = expansion * width inside a block
  int64_t classes = 10;
  double dropout = 0.0;    // after each block's GELU
  int64_t cpu_width = 64;  // the same on the CPU, where the GPU model takes minutes per step
  int64_t cpu_depth = 6;

  template <class V>
  void fields(V& v) {
    v.field("width", width, "features of the residual stream", Range<int64_t>::between(1, 65536));
    v.field("depth", depth, "residual blocks", Range<int64_t>::between(1, 1024));
    v.field("expansion", expansion, "hidden width of a block = expansion x width", Range<int64_t>::between(1, 64));
    v.field("classes", classes, "outputs of the head", Range<int64_t>::between(2, 100000));
    v.field("dropout", dropout, "dropout after each block's GELU", Range<double>::between(0, 0.99));
    v.field("cpu_width", cpu_width, "width on the CPU", Range<int64_t>::between(1, 65536));
    v.field("cpu_depth", cpu_depth, "depth on the CPU", Range<int64_t>::between(1, 1024));
  }
};

struct BenchConfig {
  int warmup = 2;      // untimed steps per measurement (the first creates the optimizer state)
  int steps = 4;       // timed steps per measurement: median over these
  int cpu_warmup = 1;  // the same on the CPU
  int cpu_steps = 2;

  template <class V>
  void fields(V& v) {
    v.field("warmup", warmup, "untimed steps per measurement", Range<int64_t>::at_least(0));
    v.field("steps", steps, "timed steps per measurement", Range<int64_t>::at_least(1));
    v.field("cpu_warmup", cpu_warmup, "untimed steps on the CPU", Range<int64_t>::at_least(0));
    v.field("cpu_steps", cpu_steps, "timed steps on the CPU", Range<int64_t>::at_least(1));
  }
};

struct SweepConfig {
  bool enabled = true;
  std::vector<std::string> precisions = {"fp32", "fp16-mixed", "bf16-mixed"};
  std::vector<int64_t> checkpoint_every = {0, 1};  // 0: no checkpointing; k: segments of k blocks
  std::vector<int64_t> batches = {1024, 2048, 4096, 8192, 16384, 32768};
  std::vector<int64_t> cpu_batches = {64, 128, 256, 512, 1024};

  template <class V>
  void fields(V& v) {
    v.field("enabled", enabled, "measure memory and throughput per batch size");
    v.field("precisions", precisions, "precisions swept", amplab::enum_choices<Precision>());
    v.field("checkpoint_every", checkpoint_every, "checkpointing settings swept (0: off)", Range<int64_t>::at_least(0));
    v.field("batches", batches, "batch sizes on a GPU", Range<int64_t>::at_least(1));
    v.field("cpu_batches", cpu_batches, "batch sizes on the CPU", Range<int64_t>::at_least(1));
  }
};

struct FinderSection {
  bool enabled = true;
  std::vector<std::string> precisions = {"fp32", "bf16-mixed"};
  mo::BatchFinderConfig search;  // start, multiple_of, trial_steps, safety margin
  int64_t cpu_start = 16;            // search.start on the CPU
  int64_t cpu_multiple_of = 8;       // search.multiple_of on the CPU
  bool brute_force = false;          // also scan linearly for the true limit (GPU check of the finder)
  int64_t brute_force_step = 64;     // batch increment of the scan
  double brute_force_from = 0.5;     // the scan starts at this fraction of the finder's answer

  FinderSection() {
    search.start = 256;
    search.multiple_of = 64;
    search.trial_steps = 3;
  }
  template <class V>
  void fields(V& v) {
    v.field("enabled", enabled, "find the largest batch that fits and the fastest one");
    v.field("precisions", precisions, "precisions searched", amplab::enum_choices<Precision>());
    v.section("search", search);
    v.field("cpu_start", cpu_start, "search.start on the CPU", Range<int64_t>::at_least(1));
    v.field("cpu_multiple_of", cpu_multiple_of, "search.multiple_of on the CPU", Range<int64_t>::at_least(1));
    v.field("brute_force", brute_force, "check the finder: scan batch sizes linearly up to the first OOM");
    v.field("brute_force_step", brute_force_step, "increment of the linear scan", Range<int64_t>::at_least(1));
    v.field("brute_force_from", brute_force_from, "the scan starts at this fraction of the finder's answer",
            Range<double>::between(0.01, 1.0));
  }
};

struct AccumulationSection {
  bool enabled = true;
  std::string precision = "fp32";  // fp16 would need the GradScaler per micro-batch
  int64_t factor = 4;              // effective batch = factor x the largest batch that fits
  int64_t steps = 10;              // optimizer steps of each curve
  int64_t cpu_steps = 5;

  template <class V>
  void fields(V& v) {
    v.field("enabled", enabled, "train beyond the largest batch with gradient accumulation");
    v.choice("precision", precision, {"fp32", "tf32", "bf16-mixed"}, "precision of both runs");
    v.field("factor", factor, "effective batch = factor x largest batch that fits", Range<int64_t>::between(2, 1024));
    v.field("steps", steps, "optimizer steps per curve", Range<int64_t>::between(1, 100000));
    v.field("cpu_steps", cpu_steps, "optimizer steps per curve on the CPU", Range<int64_t>::between(1, 100000));
  }
};

struct CheckpointSection {
  bool enabled = true;
  int64_t batch = 16384;   // one batch for every setting (memory cap lifted)
  int64_t cpu_batch = 256;
  std::vector<std::string> precisions = {"fp32", "bf16-mixed"};
  // 0 is the baseline of each precision; 24 blocks in segments of 1, 2, 4, 6 (about sqrt(24): the
  // least memory in theory) and 12: the memory/recompute trade-off along the segment length
  std::vector<int64_t> every = {0, 1, 2, 4, 6, 12};

  template <class V>
  void fields(V& v) {
    v.field("enabled", enabled, "compare memory and time with and without checkpointing");
    v.field("batch", batch, "batch size on a GPU", Range<int64_t>::at_least(1));
    v.field("cpu_batch", cpu_batch, "batch size on the CPU", Range<int64_t>::at_least(1));
    v.field("precisions", precisions, "precisions compared", amplab::enum_choices<Precision>());
    v.field("every", every, "checkpoint_every settings (0: off, the baseline)", Range<int64_t>::at_least(0));
  }
};

struct TimelineSection {
  bool enabled = true;
  int64_t batch = 8192;
  int64_t cpu_batch = 128;
  int64_t every = 1;  // the checkpointed run's checkpoint_every
  Precision precision = Precision::fp32;

  template <class V>
  void fields(V& v) {
    v.field("enabled", enabled, "memory timeline of one step (memory_timeline.csv/.png)");
    v.field("batch", batch, "batch size on a GPU", Range<int64_t>::at_least(1));
    v.field("cpu_batch", cpu_batch, "batch size on the CPU", Range<int64_t>::at_least(1));
    v.field("every", every, "checkpoint_every of the checkpointed timeline", Range<int64_t>::at_least(1));
    v.field("precision", precision, "precision of both timelines");
  }
};

struct MemLabConfig {
  double cap_gib = 4.0;         // GPU: cap the caching allocator at this for sections 1-3 (0: whole GPU)
  double cpu_limit_mib = 8.0;   // CPU: a simulated limit, from estimate_memory (RSS has no limit to hit)
  bool plots = true;
  ModelConfig model;
  BenchConfig bench;
  SweepConfig sweep;
  FinderSection finder;
  AccumulationSection accumulation;
  CheckpointSection checkpointing;
  TimelineSection timeline;

  template <class V>
  void fields(V& v) {
    v.field("cap_gib", cap_gib, "GPU memory cap (GiB) for the sweep, finder and accumulation (0: none)",
            Range<double>::at_least(0));
    v.field("cpu_limit_mib", cpu_limit_mib, "simulated memory limit on the CPU (MiB of estimated need)",
            Range<double>::positive());
    v.field("plots", plots, "write memory_batch.png and memory_timeline.png (needs matplotlib)");
    v.section("model", model);
    v.section("bench", bench);
    v.section("sweep", sweep);
    v.section("finder", finder);
    v.section("accumulation", accumulation);
    v.section("checkpointing", checkpointing);
    v.section("timeline", timeline);
  }
};

// What the training step needs from the trainer config (precision is set per row).
struct StepSettings {
  amplab::OptimizerConfig optimizer;
  amplab::GradScalerConfig grad_scaler;
  template <class V>
  void fields(V& v) {
    v.section("optimizer", optimizer);
    v.section("grad_scaler", grad_scaler);
  }
};

struct LabConfig {
  amplab::RunConfig run;
  StepSettings train;
  MemLabConfig mem;
  template <class V>
  void fields(V& v) {
    v.section("run", run);
    v.section("train", train);
    v.section("mem", mem);
  }
};

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }
std::string percent(double fraction) { return amplab::fixed(100.0 * fraction, 0) + "%"; }
std::string times(double factor) { return factor > 0 ? amplab::fixed(factor, 2) + "x" : "-"; }

// ---- The lab's shared state -------------------------------------------------------------------

struct Lab {
  LabConfig config;
  torch::Device device{torch::kCPU};
  bool cpu = true;
  mo::DeepMlpOptions shape;
  mo::DeepMlp model{nullptr};
  std::vector<torch::Tensor> initial;  // host copies of the initial parameters: every run starts there
  torch::Tensor teacher;               // (width, classes): labels of the synthetic data
  int64_t parameters = 0;
  int64_t cap_bytes = 0;               // GPU memory cap in force (0: none)

  amplab::LossFn loss_fn() {
    return [m = model](const amplab::Batch& b) mutable { return mo::loss_of(m, b); };
  }
  void reset(int64_t checkpoint_every) {
    torch::NoGradGuard no_grad;
    auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(initial[i]);
    model->zero_grad(/*set_to_none=*/true);
    model->checkpoint_every = checkpoint_every;
  }
  amplab::TrainConfig train_config(Precision precision) const {
    amplab::TrainConfig t;
    t.precision = precision;
    t.optimizer = config.train.optimizer;
    t.grad_scaler = config.train.grad_scaler;
    t.progress = false;
    return t;
  }
  int warmup() const { return cpu ? config.mem.bench.cpu_warmup : config.mem.bench.warmup; }
  int steps() const { return cpu ? config.mem.bench.cpu_steps : config.mem.bench.steps; }
  bool momentum() const { return config.train.optimizer.name != "sgd" || config.train.optimizer.momentum > 0; }
  mo::MemoryEstimate estimate(Precision precision, int64_t every) const {
    return mo::estimate_memory(shape, precision, every, momentum());
  }
  // CPU: the simulated limit (RSS has none to hit). GPU: none; running out of memory decides.
  mo::FitsFn simulated_fits(Precision precision, int64_t every) const {
    if (!cpu) return {};
    auto e = estimate(precision, every);
    double limit = config.mem.cpu_limit_mib * (1 << 20);
    return [e, limit](int64_t batch) { return static_cast<double>(e.at(batch)) <= limit; };
  }
  void set_cap(int64_t bytes) {
    if (cpu) return;
    amplab::limit_device_memory(device, bytes);
    cap_bytes = bytes;
  }
};

std::string setting_name(Precision precision, int64_t every) {
  std::string name = amplab::to_string(precision);
  if (every == 1) name += " + checkpointing";
  if (every > 1) name += " + checkpointing/" + std::to_string(every);
  return name;
}

// One setting at one batch size: the model from its initial parameters, a fresh Trainer (the
// core's step) and fresh data; `steps` timed steps through your measure().
mo::Measurement run_setting(Lab& lab, Precision precision, int64_t every, int64_t batch) {
  lab.reset(every);
  mo::Measurement m;
  {
    amplab::MemoryConfig untracked;
    untracked.track = false;  // the tracker resets peaks per phase: it would spoil the step's peak
    amplab::Trainer trainer(lab.model.ptr(), lab.loss_fn(), lab.train_config(precision), lab.device, amplab::course_mechanisms(), untracked);
    amplab::Batch data;
    m = mo::measure([&] {
      if (!data.input.defined()) data = mo::make_batch(batch, lab.teacher, lab.device);  // inside: it may not fit either
      trainer.step(data);
    }, lab.device, lab.warmup(), lab.steps());
  }
  lab.model->zero_grad(/*set_to_none=*/true);
  amplab::free_cached_memory(lab.device);
  return m;
}

double samples_per_second(const mo::Measurement& m, int64_t batch) {
  return m.fits && m.step_ms > 0 ? static_cast<double>(batch) / (m.step_ms / 1e3) : 0.0;
}

// ---- 1. Memory and throughput per batch size ------------------------------------------------------

nlohmann::json sweep(Lab& lab, amplab::RunDir& run) {
  const auto& c = lab.config.mem.sweep;
  const auto& batches = lab.cpu ? c.cpu_batches : c.batches;
  amplab::Table table({"setting", "batch", "fits", "peak alloc MiB", "peak reserved MiB", "estimate MiB", "ms/step", "samples/s"});
  amplab::Table csv({"setting", "precision", "checkpoint_every", "batch", "fits", "simulated", "peak_mib", "reserved_mib",
                     "estimate_mib", "step_ms", "samples_per_s", "memory_source", "error"});
  nlohmann::json rows = nlohmann::json::array();
  std::string notes;
  const std::string source = amplab::memory_is_rss(lab.device) ? "cpu_rss" : "cuda_allocator";
  for (const auto& name : c.precisions) {
    Precision precision = amplab::enum_from_string<Precision>(name, "mem.sweep.precisions");
    std::string why;
    if (!amplab::is_supported(precision, lab.device, &why)) {
      notes += "  " + name + ": skipped, " + why + "\n";
      continue;
    }
    for (int64_t every : c.checkpoint_every) {
      const std::string setting = setting_name(precision, every);
      auto fits = lab.simulated_fits(precision, every);
      auto estimate = lab.estimate(precision, every);
      bool failed_smaller = false;
      for (int64_t batch : batches) {
        std::string est = amplab::fixed(mib(estimate.at(batch)), 0);
        if (failed_smaller) {
          table.add_row({setting, std::to_string(batch), "(skipped)", "-", "-", est, "-", "-"});
          continue;
        }
        mo::Measurement m;
        bool simulated = fits && !fits(batch);
        if (simulated) {
          m.error = "over the simulated limit of " + amplab::fixed(lab.config.mem.cpu_limit_mib, 0) + " MiB";
        } else {
          amplab::log::info("sweep: " + setting + ", batch " + std::to_string(batch));
          m = run_setting(lab, precision, every, batch);
        }
        failed_smaller = !m.fits;
        double sps = samples_per_second(m, batch);
        std::string fit_text = m.fits ? "yes" : (simulated ? "OOM (simulated)" : "OOM");
        table.add_row({setting, std::to_string(batch), fit_text, m.fits || !simulated ? amplab::fixed(m.peak_allocated_mib, 0) : "-",
                       m.fits || !simulated ? amplab::fixed(m.peak_reserved_mib, 0) : "-", est,
                       m.fits ? amplab::fixed(m.step_ms, 2) : "-", m.fits ? amplab::fixed(sps, 0) : "-"});
        csv.add_row({setting, name, std::to_string(every), std::to_string(batch), m.fits ? "yes" : "no",
                     simulated ? "yes" : "no", amplab::fixed(m.peak_allocated_mib, 1), amplab::fixed(m.peak_reserved_mib, 1),
                     amplab::fixed(mib(estimate.at(batch)), 1), amplab::fixed(m.step_ms, 3), amplab::fixed(sps, 1), source,
                     m.error});
        rows.push_back({{"setting", setting}, {"precision", name}, {"checkpoint_every", every}, {"batch", batch},
                        {"fits", m.fits}, {"simulated", simulated}, {"peak_allocated_mib", m.peak_allocated_mib},
                        {"peak_reserved_mib", m.peak_reserved_mib}, {"estimate_mib", mib(estimate.at(batch))},
                        {"step_ms", m.step_ms}, {"samples_per_second", sps}, {"error", m.error}});
      }
    }
  }
  std::cout << "\n== 1. Memory and throughput per batch size"
            << (lab.cap_bytes > 0 ? " (GPU capped at " + amplab::fixed(mib(lab.cap_bytes) / 1024, 1) + " GiB)" : "")
            << " ==\n"
            << table.to_string() << notes;
  if (lab.cpu)
    std::cout << "memory: process RSS high-water mark (it includes everything else in the process and rarely shrinks);\n"
                 "'fits' is decided by a simulated limit of "
              << amplab::fixed(lab.config.mem.cpu_limit_mib, 0)
              << " MiB on estimate_memory(). Peak allocated/reserved and real OOMs need a GPU.\n";
  else
    std::cout << "peak alloc: bytes held by tensors; peak reserved: bytes the caching allocator took from the driver\n"
                 "(the difference is cached free blocks and fragmentation). A setting stops at its first OOM.\n";
  csv.write_csv(run.file("memory_per_batch.csv"));
  return rows;
}

// ---- 2. The batch-size finder -----------------------------------------------------------------------

struct FinderResult {
  Precision precision;
  mo::BatchSearch search;
  int64_t brute_force_limit = 0;  // 0: not checked
  std::string brute_force_note;
};

FinderResult find_batch(Lab& lab, Precision precision, amplab::Table& csv) {
  const auto& c = lab.config.mem.finder;
  mo::BatchFinderConfig search_config = c.search;
  if (lab.cpu) {
    search_config.start = c.cpu_start;
    search_config.multiple_of = c.cpu_multiple_of;
  }
  FinderResult result{precision, {}, 0, ""};
  lab.reset(0);
  amplab::MemoryConfig untracked;
  untracked.track = false;
  amplab::Trainer trainer(lab.model.ptr(), lab.loss_fn(), lab.train_config(precision), lab.device, amplab::course_mechanisms(), untracked);
  mo::BatchStep step = [&](int64_t batch) {
    amplab::Batch data = mo::make_batch(batch, lab.teacher, lab.device);
    trainer.step(data);
  };
  auto fits = lab.simulated_fits(precision, 0);
  amplab::log::info("finder: " + amplab::to_string(precision));
  result.search = mo::find_batch_size(step, *lab.model, &trainer.optimizer(), lab.device, search_config, fits);
  const std::string name = amplab::to_string(precision);
  for (const auto& t : result.search.trials)
    csv.add_row({name, "search", std::to_string(t.batch), t.fits ? "yes" : "no", t.ran ? "no" : "yes",
                 amplab::fixed(t.step_ms, 3), amplab::fixed(t.samples_per_second, 1), amplab::fixed(t.peak_allocated_mib, 1),
                 amplab::fixed(t.peak_reserved_mib, 1), t.error});

  // The check: a linear scan from a fraction of the answer up to the first batch that fails.
  if (c.brute_force && result.search.largest_fit > 0) {
    amplab::TrainingSnapshot snapshot(*lab.model, &trainer.optimizer());
    const int64_t m = c.brute_force_step;
    int64_t batch = mo::round_down_to(
        static_cast<int64_t>(static_cast<double>(result.search.largest_fit) * c.brute_force_from), m);
    int64_t last_fit = 0;
    int scanned = 0;
    bool hit_oom = false;
    // Up to twice the finder's first OOM at most: a scan that gets there without failing has
    // shown the finder wrong already.
    const int64_t scan_max = std::min(search_config.max_batch,
                                      2 * std::max(result.search.smallest_oom, result.search.largest_fit));
    amplab::log::info("brute force: " + name + " from batch " + std::to_string(batch) + " in steps of " + std::to_string(m));
    for (; batch <= scan_max; batch += m) {
      mo::BatchTrial t = mo::try_batch(step, *lab.model, lab.device, batch, search_config, fits);
      snapshot.restore();
      ++scanned;
      csv.add_row({name, "brute_force", std::to_string(t.batch), t.fits ? "yes" : "no", t.ran ? "no" : "yes",
                   amplab::fixed(t.step_ms, 3), amplab::fixed(t.samples_per_second, 1),
                   amplab::fixed(t.peak_allocated_mib, 1), amplab::fixed(t.peak_reserved_mib, 1), t.error});
      if (!t.fits) {
        hit_oom = true;
        break;
      }
      last_fit = batch;
    }
    result.brute_force_limit = last_fit;
    result.brute_force_note = std::to_string(scanned) + " batches scanned in steps of " + std::to_string(m);
    if (!hit_oom) result.brute_force_note += "; stopped at " + std::to_string(scan_max) + " without an OOM";
    if (last_fit == 0) result.brute_force_note += "; the scan's first batch did not fit (memory not monotonic in batch?)";
  }
  lab.model->zero_grad(/*set_to_none=*/true);
  amplab::free_cached_memory(lab.device);
  return result;
}

std::vector<FinderResult> finder(Lab& lab, amplab::RunDir& run, nlohmann::json& out) {
  const auto& c = lab.config.mem.finder;
  std::vector<FinderResult> results;
  amplab::Table csv({"precision", "phase", "batch", "fits", "simulated", "step_ms", "samples_per_s", "peak_mib",
                     "reserved_mib", "error"});
  for (const auto& name : c.precisions) {
    Precision precision = amplab::enum_from_string<Precision>(name, "mem.finder.precisions");
    if (!amplab::is_supported(precision, lab.device)) continue;
    results.push_back(find_batch(lab, precision, csv));
  }
  amplab::Table table({"precision", "trials", "largest fit", "first OOM", "recommended", "best throughput", "samples/s",
                       "brute-force limit", "finder / true"});
  out = nlohmann::json::array();
  for (const auto& r : results) {
    const auto& s = r.search;
    double ratio = r.brute_force_limit > 0 ? static_cast<double>(s.largest_fit) / static_cast<double>(r.brute_force_limit) : 0;
    table.add_row({amplab::to_string(r.precision), std::to_string(s.trials.size()), std::to_string(s.largest_fit),
                   s.smallest_oom > 0 ? std::to_string(s.smallest_oom) : "none", std::to_string(s.recommended),
                   std::to_string(s.best_throughput), amplab::fixed(s.best_samples_per_second, 0),
                   r.brute_force_limit > 0 ? std::to_string(r.brute_force_limit) : "-",
                   ratio > 0 ? amplab::fixed(ratio, 3) : "-"});
    out.push_back({{"precision", amplab::to_string(r.precision)}, {"trials", s.trials.size()}, {"largest_fit", s.largest_fit},
                   {"smallest_oom", s.smallest_oom}, {"recommended", s.recommended},
                   {"best_throughput", s.best_throughput}, {"best_samples_per_second", s.best_samples_per_second},
                   {"brute_force_limit", r.brute_force_limit}, {"finder_over_true", ratio},
                   {"brute_force_note", r.brute_force_note}});
  }
  const auto& sc = c.search;
  std::cout << "\n== 2. Batch-size finder (powers of two from " << (lab.cpu ? c.cpu_start : sc.start)
            << ", then bisection to multiples of " << (lab.cpu ? c.cpu_multiple_of : sc.multiple_of) << "; "
            << sc.trial_steps << " steps per trial; safety margin " << percent(sc.safety_margin) << ") ==\n"
            << table.to_string();
  for (const auto& r : results) {
    if (r.brute_force_limit <= 0) continue;
    double ratio = static_cast<double>(r.search.largest_fit) / static_cast<double>(r.brute_force_limit);
    std::cout << amplab::to_string(r.precision) << ": the finder's largest batch is " << amplab::fixed(100 * ratio, 1)
              << "% of the true limit (" << r.brute_force_note << "): within 5%: "
              << (std::abs(1 - ratio) <= 0.05 ? "yes" : "NO") << "\n";
  }
  if (lab.cpu)
    std::cout << "(CPU: 'fits' comes from the simulated limit; on a GPU each trial runs until the allocator runs out)\n";
  csv.write_csv(run.file("finder.csv"));
  return results;
}

// ---- 3. Gradient accumulation -----------------------------------------------------------------------

struct Curve {
  std::vector<double> loss;  // per optimizer step
  double peak_mib = 0;
  double seconds = 0;
};

// `steps` optimizer steps over batches of `effective` samples (the same data for every call),
// gradients computed with your accumulate_gradients in micro-batches of `micro`.
Curve train_curve(Lab& lab, Precision precision, int64_t effective, int64_t micro, int64_t steps) {
  lab.reset(0);
  Curve curve;
  amplab::MemoryConfig untracked;
  untracked.track = false;
  amplab::Trainer trainer(lab.model.ptr(), lab.loss_fn(), lab.train_config(precision), lab.device,
                          amplab::course_mechanisms(), untracked);
  std::vector<torch::Tensor> losses;
  amplab::free_cached_memory(lab.device);
  amplab::reset_peak_memory(lab.device);
  amplab::synchronize(lab.device);
  amplab::Stopwatch clock;
  for (int64_t s = 0; s < steps; ++s) {
    torch::manual_seed(static_cast<uint64_t>(lab.config.run.seed) + 1000 + static_cast<uint64_t>(s));  // same data in both runs
    amplab::Batch batch = mo::make_batch(effective, lab.teacher, lab.device);
    losses.push_back(trainer.step(mo::split_batch(batch, micro)).loss);  // your accumulate_gradients when micro < effective
  }
  amplab::synchronize(lab.device);
  curve.seconds = clock.seconds();
  curve.peak_mib = mib(amplab::read_memory(lab.device).peak_allocated);
  for (const auto& l : losses) curve.loss.push_back(l.item<double>());
  lab.model->zero_grad(/*set_to_none=*/true);
  return curve;
}

nlohmann::json accumulation(Lab& lab, const std::vector<FinderResult>& found, amplab::RunDir& run) {
  const auto& c = lab.config.mem.accumulation;
  Precision precision = amplab::enum_from_string<Precision>(c.precision, "mem.accumulation.precision");
  std::string why;
  if (!amplab::is_supported(precision, lab.device, &why)) {
    std::cout << "\n== 3. Gradient accumulation ==\nskipped: " << why << "\n";
    return {{"skipped_because", why}};
  }
  // The largest batch that fits at this precision: from the finder, or found now.
  std::optional<mo::BatchSearch> search;
  for (const auto& r : found)
    if (r.precision == precision) search = r.search;
  if (!search) {
    amplab::Table unused({"precision", "phase", "batch", "fits", "simulated", "step_ms", "samples_per_s", "peak_mib",
                          "reserved_mib", "error"});
    search = find_batch(lab, precision, unused).search;
  }
  if (search->largest_fit <= 0) {
    std::cout << "\n== 3. Gradient accumulation ==\nskipped: not even the smallest batch fits\n";
    return {{"skipped_because", "nothing fits"}};
  }
  const int64_t largest = search->largest_fit, micro = search->recommended;
  const int64_t effective = c.factor * largest;
  const int64_t chunks = (effective + micro - 1) / micro;

  // The big batch, as one step, does not fit.
  std::string big_batch_fits;
  auto fits = lab.simulated_fits(precision, 0);
  if (fits) {
    big_batch_fits = fits(effective) ? "fits (simulated)" : "does not fit (simulated limit)";
  } else {
    amplab::log::info("accumulation: trying the big batch " + std::to_string(effective) + " in one step");
    mo::Measurement m = run_setting(lab, precision, 0, effective);
    big_batch_fits = m.fits ? "fits" : "does not fit: " + m.error;
  }
  const int64_t steps = lab.cpu ? c.cpu_steps : c.steps;
  amplab::log::info("accumulation: " + std::to_string(steps) + " steps of " + std::to_string(effective) + " in " +
                    std::to_string(chunks) + " micro-batches");
  Curve accumulated;
  try {
    accumulated = train_curve(lab, precision, effective, micro, steps);
  } catch (const std::exception& error) {
    if (!amplab::is_out_of_memory(error)) throw;
    lab.model->zero_grad(/*set_to_none=*/true);
    amplab::free_cached_memory(lab.device);
    std::cout << "\n== 3. Gradient accumulation ==\nmicro-batches of " << micro << " ran out of memory ("
              << amplab::oom_summary(error) << "): raise mem.finder.search.safety_margin\n";
    return {{"skipped_because", amplab::oom_summary(error)}};
  }

  // The reference: the big batch itself, with the cap lifted (a GPU has the memory; the cap was
  // only there to make the limit small).
  const int64_t cap = lab.cap_bytes;
  lab.set_cap(0);
  amplab::log::info("accumulation: the big batch in one step, memory cap lifted");
  Curve big = train_curve(lab, precision, effective, effective, steps);
  lab.set_cap(cap);

  amplab::Table table({"step", "loss, accumulated", "loss, big batch", "|difference|"});
  amplab::Table csv({"step", "loss_accumulated", "loss_big_batch", "abs_difference"});
  double max_diff = 0, max_rel = 0;
  for (size_t s = 0; s < accumulated.loss.size(); ++s) {
    double d = std::abs(accumulated.loss[s] - big.loss[s]);
    max_diff = std::max(max_diff, d);
    max_rel = std::max(max_rel, d / std::max(1e-12, std::abs(big.loss[s])));
    table.add_row({std::to_string(s), amplab::fixed(accumulated.loss[s], 6), amplab::fixed(big.loss[s], 6),
                   amplab::si(d)});
    csv.add_row({std::to_string(s), amplab::fixed(accumulated.loss[s], 9), amplab::fixed(big.loss[s], 9),
                 amplab::fixed(d, 12)});
  }
  csv.write_csv(run.file("accumulation.csv"));
  std::cout << "\n== 3. Gradient accumulation (" << c.precision << ") ==\n"
            << "largest batch that fits: " << largest << "; effective batch " << effective << " = " << c.factor
            << " x that, in " << chunks << " micro-batches of at most " << micro << " (the finder's recommendation)\n"
            << "the effective batch in one step " << big_batch_fits << "\n"
            << table.to_string() << "max |difference| " << amplab::si(max_diff) << " (relative " << amplab::si(max_rel)
            << "): the same curve, up to float rounding\n"
            << "peak memory: accumulated " << amplab::fixed(accumulated.peak_mib, 0) << " MiB, big batch "
            << amplab::fixed(big.peak_mib, 0) << " MiB" << (lab.cpu ? " (RSS high-water marks)" : " (cap lifted for it)")
            << "; time: " << amplab::fixed(accumulated.seconds, 2) << " s vs " << amplab::fixed(big.seconds, 2) << " s\n";
  return {{"precision", c.precision}, {"largest_fit", largest}, {"micro_batch", micro}, {"effective_batch", effective},
          {"micro_batches", chunks}, {"big_batch_in_one_step", big_batch_fits},
          {"loss_accumulated", accumulated.loss}, {"loss_big_batch", big.loss}, {"max_abs_difference", max_diff},
          {"max_rel_difference", max_rel}, {"peak_mib_accumulated", accumulated.peak_mib},
          {"peak_mib_big_batch", big.peak_mib}, {"seconds_accumulated", accumulated.seconds},
          {"seconds_big_batch", big.seconds}};
}

// ---- 4. Activation checkpointing ----------------------------------------------------------------------

nlohmann::json checkpointing(Lab& lab, amplab::RunDir& run) {
  const auto& c = lab.config.mem.checkpointing;
  const int64_t batch = lab.cpu ? c.cpu_batch : c.batch;
  struct Row {
    Precision precision;
    int64_t every;
    mo::Measurement m;
  };
  std::vector<Row> rows;
  std::string notes;
  for (int64_t every : c.every)
    if (every >= lab.shape.depth)
      notes += "  checkpointing/" + std::to_string(every) + ": left out, one segment of all " +
               std::to_string(lab.shape.depth) + " blocks is no checkpointing\n";
  for (const auto& name : c.precisions) {
    Precision precision = amplab::enum_from_string<Precision>(name, "mem.checkpointing.precisions");
    std::string why;
    if (!amplab::is_supported(precision, lab.device, &why)) {
      notes += "  " + name + ": skipped, " + why + "\n";
      continue;
    }
    for (int64_t every : c.every) {
      if (every >= lab.shape.depth) continue;
      amplab::log::info("checkpointing: " + setting_name(precision, every) + ", batch " + std::to_string(batch));
      rows.push_back({precision, every, run_setting(lab, precision, every, batch)});
    }
  }
  const Row* fp32_plain = nullptr;
  for (const auto& r : rows)
    if (r.precision == Precision::fp32 && r.every == 0) fp32_plain = &r;
  amplab::Table table({"setting", "peak alloc MiB", "peak reserved MiB", "estimate MiB", "ms/step", "samples/s",
                       "memory saving", "time overhead", "saving vs fp32", "est. saving vs fp32"});
  amplab::Table csv({"precision", "checkpoint_every", "batch", "fits", "peak_mib", "reserved_mib", "estimate_mib", "step_ms",
                     "samples_per_s", "memory_saving", "time_overhead", "memory_saving_vs_fp32", "time_overhead_vs_fp32",
                     "error"});
  nlohmann::json out = nlohmann::json::array();
  std::string checks;
  for (const auto& r : rows) {
    const Row* base = nullptr;  // the same precision without checkpointing
    for (const auto& b : rows)
      if (b.precision == r.precision && b.every == 0) base = &b;
    mo::Comparison same = base ? mo::compare(base->m, r.m) : mo::Comparison{};
    mo::Comparison vs_fp32 = fp32_plain ? mo::compare(fp32_plain->m, r.m) : mo::Comparison{};
    double est = mib(lab.estimate(r.precision, r.every).at(batch));
    double est_fp32 = mib(lab.estimate(Precision::fp32, 0).at(batch));
    double sps = samples_per_second(r.m, batch);
    const std::string setting = setting_name(r.precision, r.every);
    table.add_row({setting, r.m.fits ? amplab::fixed(r.m.peak_allocated_mib, 0) : "OOM",
                   r.m.fits ? amplab::fixed(r.m.peak_reserved_mib, 0) : "-", amplab::fixed(est, 0),
                   r.m.fits ? amplab::fixed(r.m.step_ms, 2) : "-", r.m.fits ? amplab::fixed(sps, 0) : "-",
                   r.every > 0 ? times(same.memory_saving) : "1.00x",
                   r.every > 0 && same.memory_saving > 0 ? (same.time_overhead >= 0 ? "+" : "") + percent(same.time_overhead) : "-",
                   times(vs_fp32.memory_saving), times(est_fp32 / est)});
    csv.add_row({amplab::to_string(r.precision), std::to_string(r.every), std::to_string(batch), r.m.fits ? "yes" : "no",
                 amplab::fixed(r.m.peak_allocated_mib, 1), amplab::fixed(r.m.peak_reserved_mib, 1), amplab::fixed(est, 1),
                 amplab::fixed(r.m.step_ms, 3), amplab::fixed(sps, 1), amplab::fixed(same.memory_saving, 3),
                 amplab::fixed(same.time_overhead, 4), amplab::fixed(vs_fp32.memory_saving, 3),
                 amplab::fixed(vs_fp32.time_overhead, 4), r.m.error});
    out.push_back({{"setting", setting}, {"precision", amplab::to_string(r.precision)}, {"checkpoint_every", r.every},
                   {"batch", batch}, {"fits", r.m.fits}, {"peak_allocated_mib", r.m.peak_allocated_mib},
                   {"peak_reserved_mib", r.m.peak_reserved_mib}, {"estimate_mib", est}, {"step_ms", r.m.step_ms},
                   {"samples_per_second", sps}, {"memory_saving", same.memory_saving},
                   {"time_overhead", same.time_overhead}, {"memory_saving_vs_fp32", vs_fp32.memory_saving},
                   {"time_overhead_vs_fp32", vs_fp32.time_overhead}, {"estimated_saving_vs_fp32", est_fp32 / est},
                   {"error", r.m.error}});
    // The lab's targets, stated where they are measured.
    if (r.every == 1 && r.precision == Precision::fp32 && same.memory_saving > 0)
      checks += "checkpointing every block, fp32: " + times(same.memory_saving) + " less peak memory for +" +
                percent(same.time_overhead) + " step time (target: >= 2x at < 40%: " +
                (same.memory_saving >= 2 && same.time_overhead < 0.4 ? "met" : "NOT met") + ")\n";
    if (r.every == 1 && amplab::is_mixed(r.precision) && vs_fp32.memory_saving > 0)
      checks += amplab::to_string(r.precision) + " + checkpointing every block vs fp32: " + times(vs_fp32.memory_saving) +
                " less peak memory (target: >= 3x: " + (vs_fp32.memory_saving >= 3 ? "met" : "NOT met") + ")\n";
  }
  csv.write_csv(run.file("checkpointing.csv"));
  std::cout << "\n== 4. Activation checkpointing (batch " << batch << (lab.cpu ? "" : ", no memory cap") << ") ==\n"
            << "memory saving and time overhead against the same precision without checkpointing; "
               "'checkpointing/k': segments of k blocks\n"
            << table.to_string() << notes;
  if (lab.cpu)
    std::cout << "(CPU: the peaks are RSS high-water marks of the whole process and barely move; the estimates show\n"
                 " what a GPU allocator would be asked for. The savings need a GPU to measure.)\n";
  else
    std::cout << checks;
  return out;
}

// ---- 5. Memory timeline of one step -------------------------------------------------------------------

nlohmann::json timeline(Lab& lab, amplab::RunDir& run) {
  const auto& c = lab.config.mem.timeline;
  const int64_t batch = lab.cpu ? c.cpu_batch : c.batch;
  std::string why;
  if (!amplab::is_supported(c.precision, lab.device, &why)) {
    std::cout << "\n== 5. Memory timeline ==\nskipped: " << why << "\n";
    return {{"skipped_because", why}};
  }
  amplab::Table csv({"setting", "sample", "step", "phase", "event", "seconds", "allocated_mib", "reserved_mib",
                     "peak_allocated_mib", "source"});
  amplab::Table table({"setting", "forward peak MiB", "backward peak MiB", "optimizer peak MiB", "samples"});
  nlohmann::json out = nlohmann::json::array();
  for (int64_t every : {int64_t{0}, c.every}) {
    const std::string setting = setting_name(c.precision, every);
    lab.reset(every);
    amplab::MemoryConfig tracked;  // per-phase peaks and a timeline
    {
      amplab::Trainer trainer(lab.model.ptr(), lab.loss_fn(), lab.train_config(c.precision), lab.device, amplab::course_mechanisms(), tracked);
      lab.model->set_probe([&trainer] { trainer.memory().sample(); });  // after each block, forward and backward
      amplab::Batch data = mo::make_batch(batch, lab.teacher, lab.device);
      amplab::free_cached_memory(lab.device);
      for (int step = 0; step < 2; ++step) trainer.step(data);  // step 1: optimizer state exists
      lab.model->set_probe({});
      int sample = 0;
      std::map<std::string, double> phase_peak;
      for (const auto& s : trainer.memory().timeline()) {
        if (s.step != 1) continue;
        const std::string phase = amplab::to_string(s.phase);
        phase_peak[phase] = std::max(phase_peak[phase], mib(s.reading.peak_allocated));
        csv.add_row({setting, std::to_string(sample++), std::to_string(s.step), phase, s.phase_end ? "phase_end" : "sample",
                     amplab::fixed(s.seconds, 6), amplab::fixed(mib(s.reading.allocated), 2),
                     amplab::fixed(mib(s.reading.reserved), 2), amplab::fixed(mib(s.reading.peak_allocated), 2),
                     amplab::memory_is_rss(lab.device) ? "cpu_rss" : "cuda_allocator"});
      }
      table.add_row({setting, amplab::fixed(phase_peak["forward"], 0), amplab::fixed(phase_peak["backward"], 0),
                     amplab::fixed(phase_peak["optimizer"], 0), std::to_string(sample)});
      out.push_back({{"setting", setting}, {"forward_peak_mib", phase_peak["forward"]},
                     {"backward_peak_mib", phase_peak["backward"]}, {"optimizer_peak_mib", phase_peak["optimizer"]}});
    }
    lab.model->zero_grad(/*set_to_none=*/true);
    amplab::free_cached_memory(lab.device);
  }
  csv.write_csv(run.file("memory_timeline.csv"));
  std::cout << "\n== 5. Memory timeline of one step (" << amplab::to_string(c.precision) << ", batch " << batch
            << "; a sample after each block's forward and when backward reaches it) ==\n"
            << table.to_string()
            << "without checkpointing, memory climbs through the forward pass (every block's activations kept) and\n"
               "falls through backward; with it, the forward climbs by one input per block, and backward recomputes\n"
               "one segment at a time. memory_timeline.csv / memory_timeline.png\n";
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  return amplab::guarded_main([&]() -> int {
    LabConfig config, defaults;
    amplab::CommandLine cli;
    if (auto code = amplab::parse_command_line(argc, argv, "memory_optimization",
                                               "Lab 3: memory optimization (batch size, precision, accumulation, checkpointing)",
                                               amplab::describe_keys(defaults), cli, /*accepts_resume=*/false))
      return *code;
    amplab::load_lab_config(cli, config);
    amplab::RunDir run = amplab::RunDir::create(config.run, "memory_optimization", amplab::to_yaml(config));
    amplab::apply_run_settings(config.run);

    Lab lab;
    lab.config = config;
    lab.device = amplab::resolve_device(config.run.device);
    lab.cpu = !lab.device.is_cuda();
    const auto& mc = config.mem.model;
    lab.shape.width = lab.cpu ? mc.cpu_width : mc.width;
    lab.shape.depth = lab.cpu ? mc.cpu_depth : mc.depth;
    lab.shape.expansion = mc.expansion;
    lab.shape.classes = mc.classes;
    lab.shape.dropout = mc.dropout;
    torch::manual_seed(static_cast<uint64_t>(config.run.seed));
    {  // The model is made on the CPU, with a copy of its initial weights: refused up front, naming the keys.
      const double w = static_cast<double>(lab.shape.width), depth = static_cast<double>(lab.shape.depth);
      const double params = depth * (2.0 * static_cast<double>(lab.shape.expansion) * w * w) + w * static_cast<double>(lab.shape.classes);
      amplab::require_cpu_memory(static_cast<int64_t>(std::min(2.0 * 4.0 * params, 9e18)), "the model",
                                 lab.cpu ? "mem.model.cpu_width, mem.model.cpu_depth or mem.model.expansion"
                                         : "mem.model.width, mem.model.depth or mem.model.expansion");
    }
    lab.model = mo::DeepMlp(lab.shape);
    for (const auto& p : lab.model->parameters()) {
      lab.initial.push_back(p.detach().clone());
      lab.parameters += p.numel();
    }
    lab.model->to(lab.device);
    lab.teacher = torch::randn({lab.shape.width, lab.shape.classes}).to(lab.device);

    std::cout << "== Memory optimization on " << amplab::describe(lab.device) << " ==\n"
              << "model: " << lab.shape.depth << " residual blocks x + Linear(" << lab.shape.expansion * lab.shape.width
              << ", " << lab.shape.width << ")(GELU(Linear(" << lab.shape.width << ", "
              << lab.shape.expansion * lab.shape.width << ")(LayerNorm(x)))), head " << lab.shape.classes
              << " classes; " << amplab::fixed(lab.parameters / 1e6, 2) << " M parameters ("
              << amplab::fixed(mib(lab.parameters * 4), 0) << " MiB fp32)\n";
    auto e = lab.estimate(Precision::fp32, 0);
    std::cout << "estimated need, fp32: " << amplab::fixed(mib(e.fixed), 0)
              << " MiB fixed (weights, optimizer state) + the larger of " << amplab::fixed(mib(e.gradients), 0)
              << " MiB of gradients (at the optimizer step) and " << amplab::fixed(e.per_sample / 1024.0, 1)
              << " KiB per sample (activations, when backward starts): the activations are the larger from batch "
              << (e.per_sample > 0 ? e.gradients / e.per_sample + 1 : 0) << " up\n";
    if (lab.cpu) {
      std::cout << "(CPU run: small cpu_* sizes; memory is the process RSS and the memory limit is simulated ("
                << amplab::fixed(config.mem.cpu_limit_mib, 0)
                << " MiB of estimated need). Peak allocated vs reserved, real out-of-memory errors,\n"
                   " fp16-mixed and the memory savings need a GPU: run this on a GPU machine for the numbers that matter.)\n";
    } else if (config.mem.cap_gib > 0) {
      lab.set_cap(static_cast<int64_t>(config.mem.cap_gib * static_cast<double>(int64_t{1} << 30)));
      std::cout << "GPU memory capped at " << amplab::fixed(config.mem.cap_gib, 1) << " GiB of "
                << amplab::fixed(mib(amplab::device_total_memory(lab.device)) / 1024, 1)
                << " GiB for sections 1-3 (CUDACachingAllocator::setMemoryFraction; mem.cap_gib=0 lifts it)\n";
    }
    std::cout << std::flush;

    nlohmann::json summary{{"device", amplab::describe(lab.device)},
                           {"model", {{"width", lab.shape.width}, {"depth", lab.shape.depth}, {"expansion", lab.shape.expansion},
                                      {"classes", lab.shape.classes}, {"dropout", lab.shape.dropout},
                                      {"parameters", lab.parameters}}},
                           {"memory_cap_gib", lab.cpu ? 0.0 : config.mem.cap_gib},
                           {"memory_source", amplab::memory_is_rss(lab.device) ? "cpu_rss" : "cuda_allocator"}};
    if (lab.cpu) summary["simulated_limit_mib"] = config.mem.cpu_limit_mib;

    if (config.mem.sweep.enabled) summary["sweep"] = sweep(lab, run);
    std::cout << std::flush;
    std::vector<FinderResult> found;
    if (config.mem.finder.enabled) {
      nlohmann::json finder_json;
      found = finder(lab, run, finder_json);
      summary["finder"] = finder_json;
    }
    std::cout << std::flush;
    if (config.mem.accumulation.enabled) summary["accumulation"] = accumulation(lab, found, run);
    lab.set_cap(0);  // sections 4 and 5 compare settings at one batch, on the whole GPU
    std::cout << std::flush;
    if (config.mem.checkpointing.enabled) summary["checkpointing"] = checkpointing(lab, run);
    std::cout << std::flush;
    if (config.mem.timeline.enabled) summary["timeline"] = timeline(lab, run);

    run.write_summary(summary);
    std::cout << std::flush;  // before the plot script writes to the same stream
    if (config.mem.plots) amplab::make_plots("memory", run);
    amplab::write_report(run);
    std::cout << "\nresults: " << run.path()
              << "/ (memory_per_batch.csv, finder.csv, accumulation.csv, checkpointing.csv, memory_timeline.csv, "
                 "summary.json, memory_batch.png, memory_timeline.png)\n";
    return amplab::kExitOk;
  });
}
