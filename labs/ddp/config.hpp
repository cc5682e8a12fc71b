// The ddp lab's config: the keys of configs/ddp.yaml and what each means.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "amplab/data/mnist.hpp"
#include "amplab/infra/config.hpp"
#include "amplab/report/run_dir.hpp"
#include "amplab/state/checkpoint.hpp"
#include "amplab/train/precision.hpp"
#include "amplab/train/trainer.hpp"
#include "ddp_lab.hpp"

namespace ddp_lab {

// The bench's settings, in the order they are timed (bench.settings picks some).
inline const std::vector<std::string> kBenchSettings = {"naive", "flat", "overlapped", "bucketed",
                                                        "bucketed_fast", "bucketed_no_overlap", "bucketed_bf16", "pieces"};

struct DdpBenchConfig {
  bool enabled = false, trace = false;
  int64_t width = 8192, layers = 4, batch = 8192, first_layer_pieces = 4;
  std::vector<int64_t> bucket_sweep_mb = {1, 25, 200};
  int64_t bucket_sweep_width = 2048;
  amplab::Precision precision = amplab::Precision::bf16_mixed;
  int warmup = 5, steps = 20;
  std::vector<std::string> settings = kBenchSettings;

  template <class V>
  void fields(V& v) {
    v.field("enabled", enabled, "run the MLP step benchmark (alone, then each version of gradient sync) instead of training");
    v.field("width", width, "MLP width (the AMP lab's MLP: 4 Linear layers of 8192)", amplab::Range<int64_t>::at_least(1));
    v.field("layers", layers, "MLP layers", amplab::Range<int64_t>::at_least(1));
    v.field("batch", batch, "samples per rank", amplab::Range<int64_t>::at_least(1));
    v.field("precision", precision, "precision of the benchmark");
    v.field("warmup", warmup, "untimed steps", amplab::Range<int64_t>::at_least(0));
    v.field("steps", steps, "timed steps per setting", amplab::Range<int64_t>::at_least(1));
    v.field("settings", settings,
            "rows to time after the plain MLP alone: naive, flat, overlapped, bucketed (your four steps, one "
            "optimizer step after the sync), bucketed_fast (bucketed with the reference's settings: each bucket "
            "stepped as soon as it is reduced), bucketed_no_overlap, bucketed_bf16 (dist.compression: bf16), pieces "
            "(the first layer in bench.first_layer_pieces pieces, alone and bucketed_fast)",
            kBenchSettings);
    v.field("first_layer_pieces", first_layer_pieces,
            "the 'pieces' settings cut the MLP's first Linear into this many pieces (amplab::LinearInPieces), whose "
            "all-reduces then start piece by piece during backward",
            amplab::Range<int64_t>::at_least(1));
    v.field("bucket_sweep_mb", bucket_sweep_mb,
            "after the settings, bucketed (one optimizer step after the sync) again with each of these "
            "dist.bucket_mb caps, on an MLP of bench.bucket_sweep_width, beside that MLP alone (bucket_sweep.csv: "
            "the buckets each cap made and the times); [] leaves the sweep out",
            amplab::Range<int64_t>::at_least(1));
    v.field("bucket_sweep_width", bucket_sweep_width,
            "MLP width of the bucket sweep: at 2048 a layer's fp32 gradients are 16 MiB, so caps of 1, 25 and 200 MiB "
            "make 4, 2 and 1 buckets of the 4 layers (at width 8192 every cap below 256 MiB makes one a layer)",
            amplab::Range<int64_t>::at_least(1));
    v.field("trace", trace,
            "write timeline_<setting>.json (every rank's phases and all-reduces, from the host's clock: on CPU ranks "
            "the overlap of all-reduces with backward is there to see) and, per rank, trace_<setting>[_rank<r>].json "
            "(PyTorch's profiler: CPU ops and GPU kernels of two steps, each waited for) and "
            "trace_<setting>_back_to_back[_rank<r>].json (three steps queued without waiting) into the run "
            "directory; open them in ui.perfetto.dev, or print a kernel trace with bench/trace_steps.py");
  }
};

struct DdpCollectivesConfig {
  bool enabled = false;
  std::vector<int64_t> sizes_kib = {4, 64, 1024, 16384, 262144};
  int warmup = 5, windows = 5, iterations = 20;

  template <class V>
  void fields(V& v) {
    v.field("enabled", enabled,
            "time all-reduce, reduce-scatter and all-gather across message sizes (collectives.csv) instead of "
            "training");
    v.field("sizes_kib", sizes_kib, "the sizes of the whole buffer to time, in KiB of fp32",
            amplab::Range<int64_t>::at_least(1));
    v.field("warmup", warmup, "untimed calls per collective and size", amplab::Range<int64_t>::at_least(0));
    v.field("windows", windows, "timed windows per collective and size (the median is shown)",
            amplab::Range<int64_t>::at_least(1));
    v.field("iterations", iterations, "calls back to back per window", amplab::Range<int64_t>::at_least(1));
  }
};

struct DdpConfig {
  amplab::RunConfig run;
  amplab::DataConfig data;
  amplab::TrainConfig train;
  amplab::CheckpointConfig checkpoint;
  ddp_lab::LabDistConfig dist;
  DdpBenchConfig bench;
  DdpCollectivesConfig collectives;
  template <class V>
  void fields(V& v) {
    v.section("run", run);
    v.section("data", data);
    v.section("train", train);
    v.section("checkpoint", checkpoint);
    v.section("dist", dist);
    v.section("bench", bench);
    v.section("collectives", collectives);
  }
};

}  // namespace ddp_lab
