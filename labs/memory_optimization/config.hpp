// The memory_optimization lab's config: the keys of configs/memory_optimization.yaml and what each means.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "amplab/infra/config.hpp"
#include "amplab/report/run_dir.hpp"
#include "amplab/train/loss_scaler.hpp"
#include "amplab/train/precision.hpp"
#include "amplab/train/trainer.hpp"
#include "amplab/train/trainer.hpp"
#include "memory_optimization.hpp"

namespace memory_optimization {

using amplab::Precision;
using amplab::Range;
using Names = std::vector<std::string>;

// ---- Config (on the CPU, the `cpu:` section of configs/memory_optimization.yaml over it) -------

struct ModelConfig {
  DeepMlpOptions shape;
  template <class V> void fields(V& v) {
    v.field("width", shape.width, "features of the residual stream", Range<int64_t>::between(1, 65536));
    v.field("depth", shape.depth, "residual blocks", Range<int64_t>::between(1, 1024));
    v.field("expansion", shape.expansion, "hidden width of a block = expansion x width", Range<int64_t>::between(1, 64));
    v.field("classes", shape.classes, "outputs of the head", Range<int64_t>::between(2, 100000));
    v.field("dropout", shape.dropout, "dropout after each block's GELU", Range<double>::between(0, 0.99));
  }
};
struct BenchConfig {
  int warmup = 2, steps = 4;
  template <class V> void fields(V& v) {
    v.field("warmup", warmup, "untimed steps per measurement (the first makes the optimizer state)", Range<int64_t>::at_least(0));
    v.field("steps", steps, "timed steps per measurement (median over these)", Range<int64_t>::at_least(1));
  }
};
struct SweepConfig {
  bool enabled = true;
  Names precisions = {"fp32", "fp16-mixed", "bf16-mixed"};
  std::vector<int64_t> checkpoint_every = {0, 1}, batches = {1024, 2048, 4096, 8192, 16384, 32768};
  template <class V> void fields(V& v) {
    v.field("enabled", enabled, "measure memory and throughput per batch size");
    v.field("precisions", precisions, "precisions swept", amplab::enum_choices<Precision>());
    v.field("checkpoint_every", checkpoint_every, "checkpointing settings swept (0: off; k: segments of k blocks)",
            Range<int64_t>::at_least(0));
    v.field("batches", batches, "batch sizes", Range<int64_t>::at_least(1));
  }
};
struct FinderSection {
  bool enabled = true, brute_force = false;
  Names precisions = {"fp32", "bf16-mixed"};
  BatchFinderConfig search{.start = 256, .multiple_of = 64, .trial_steps = 3};
  int64_t brute_force_step = 64;
  double brute_force_from = 0.5;
  template <class V> void fields(V& v) {
    v.field("enabled", enabled, "find the largest batch that fits and the fastest one");
    v.field("precisions", precisions, "precisions searched", amplab::enum_choices<Precision>());
    v.section("search", search);
    v.field("brute_force", brute_force, "check the finder: scan batch sizes linearly up to the first OOM");
    v.field("brute_force_step", brute_force_step, "increment of the linear scan", Range<int64_t>::at_least(1));
    v.field("brute_force_from", brute_force_from, "the scan starts at this fraction of the finder's answer",
            Range<double>::between(0.01, 1.0));
  }
};
struct AccumulationSection {
  bool enabled = true;
  // No fp16 among the choices: it would need the GradScaler per micro-batch.
  std::string precision = "fp32";
  int64_t factor = 4, steps = 10;
  template <class V> void fields(V& v) {
    v.field("enabled", enabled, "train beyond the largest batch with gradient accumulation");
    v.choice("precision", precision, {"fp32", "tf32", "bf16-mixed"}, "precision of both runs");
    v.field("factor", factor, "effective batch = factor x largest batch that fits", Range<int64_t>::between(2, 1024));
    v.field("steps", steps, "optimizer steps per curve", Range<int64_t>::between(1, 100000));
  }
};
struct CheckpointSection {
  bool enabled = true;
  int64_t batch = 16384;
  Names precisions = {"fp32", "bf16-mixed"};
  // 0 is the baseline of each precision; 24 blocks in segments of 1, 2, 4, 6 (about sqrt(24): the
  // least memory in theory) and 12: the memory/recompute trade-off along the segment length
  std::vector<int64_t> every = {0, 1, 2, 4, 6, 12};
  template <class V> void fields(V& v) {
    v.field("enabled", enabled, "compare memory and time with and without checkpointing");
    v.field("batch", batch, "batch size of every setting (memory cap lifted)", Range<int64_t>::at_least(1));
    v.field("precisions", precisions, "precisions compared", amplab::enum_choices<Precision>());
    v.field("every", every, "checkpoint_every settings (0: off, the baseline)", Range<int64_t>::at_least(0));
  }
};
struct TimelineSection {
  bool enabled = true;
  int64_t batch = 8192, every = 1;
  Precision precision = Precision::fp32;
  template <class V> void fields(V& v) {
    v.field("enabled", enabled, "memory timeline of one step (memory_timeline.csv/.png)");
    v.field("batch", batch, "batch size", Range<int64_t>::at_least(1));
    v.field("every", every, "checkpoint_every of the checkpointed timeline", Range<int64_t>::at_least(1));
    v.field("precision", precision, "precision of both timelines");
  }
};
struct LeakSection {
  bool enabled = true;
  int64_t steps = 50, batch = 64, held_out = 256, log_every = 10;
  template <class V> void fields(V& v) {
    v.field("enabled", enabled, "the leak hunt: memory after each step with a leaky loss history and with yours");
    v.field("steps", steps, "training steps of each run", Range<int64_t>::between(2, 100000));
    v.field("batch", batch, "training batch size", Range<int64_t>::between(1, 65536));
    v.field("held_out", held_out, "samples of the held-out batch whose loss is recorded every step",
            Range<int64_t>::between(1, 65536));
    v.field("log_every", log_every, "steps between log points (LossHistory::flush)", Range<int64_t>::at_least(1));
  }
};
struct MemLabConfig {
  double cap_mib = 4096;
  bool plots = true;
  ModelConfig model;
  BenchConfig bench;
  SweepConfig sweep;
  FinderSection finder;
  AccumulationSection accumulation;
  CheckpointSection checkpointing;
  TimelineSection timeline;
  LeakSection leak;
  template <class V> void fields(V& v) {
    v.field("cap_mib", cap_mib, "memory limit (MiB) of the sweep, finder and accumulation: on a GPU the caching "
            "allocator's cap (0: none), on the CPU a simulated limit on estimate_memory()", Range<double>::at_least(0));
    v.field("plots", plots, "write memory_batch.png and memory_timeline.png (needs matplotlib)");
    v.section("model", model);
    v.section("bench", bench);
    v.section("sweep", sweep);
    v.section("finder", finder);
    v.section("accumulation", accumulation);
    v.section("checkpointing", checkpointing);
    v.section("timeline", timeline);
    v.section("leak", leak);
  }
};
struct LabConfig {
  amplab::RunConfig run;
  // Precision is set per row (StepSettings::for_row), not by a train: key.
  amplab::StepSettings train;
  MemLabConfig mem;
  template <class V> void fields(V& v) {
    v.section("run", run);
    v.section("train", train);
    v.section("mem", mem);
  }
};

}  // namespace memory_optimization
