// The amp_training lab's config: the keys of configs/amp_training.yaml and what each means.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "amplab/infra/config.hpp"
#include "amplab/report/run_dir.hpp"
#include "amplab/train/precision.hpp"
#include "amplab/train/trainer.hpp"

namespace amp_training {

using amplab::Precision;
using amplab::Range;

// The config holds the GPU's sizes; configs/amp_training.yaml's `cpu:` section has the CPU's.
struct MlpConfig {
  int64_t width = 8192, layers = 4, batch = 8192;
  template <class V> void fields(V& v) {
    v.field("width", width, "features of every Linear(width, width)", Range<int64_t>::between(1, 65536));
    v.field("layers", layers, "number of Linear layers, ReLU between them", Range<int64_t>::between(1, 64));
    v.field("batch", batch, "samples per step", Range<int64_t>::at_least(1));
  }
};

struct CnnConfig {
  int64_t channels = 64, image_size = 32, classes = 10, batch = 512;
  bool channels_last = true;
  template <class V> void fields(V& v) {
    v.field("channels", channels, "channels of the first convolution (the next two double it)", Range<int64_t>::between(1, 4096));
    v.field("image_size", image_size, "height = width of the synthetic 3-channel images", Range<int64_t>::between(4, 1024));
    v.field("classes", classes, "output classes", Range<int64_t>::between(2, 100000));
    v.field("batch", batch, "samples per step", Range<int64_t>::at_least(1));
    v.field("channels_last", channels_last, "NHWC weights and images (cuDNN's fast layout for tensor cores)");
  }
};

struct BenchConfig {
  int warmup = 3, repeats = 10, window = 5;
  int64_t peak_n = 8192;
  template <class V> void fields(V& v) {
    v.field("warmup", warmup, "untimed steps before timing (cuBLAS/cuDNN set-up, allocator warm-up)", Range<int64_t>::at_least(0));
    v.field("repeats", repeats, "timed windows (median and IQR over these)", Range<int64_t>::at_least(1));
    v.field("window", window, "steps per timed window, timed together", Range<int64_t>::at_least(1));
    v.field("peak_n", peak_n, "n of the bf16 n x n x n matmul that measures the peak", Range<int64_t>::between(16, 32768));
  }
};

struct UnderflowConfig {
  bool enabled = true;
  int64_t depth = 8, width = 256, batch = 256;
  std::vector<int64_t> loss_exponents = {0, -2, -3, -4};
  template <class V> void fields(V& v) {
    v.field("enabled", enabled, "show how many fp16 gradients flush to zero with and without loss scaling");
    v.field("depth", depth, "hidden Linear + tanh layers of the deep narrow net", Range<int64_t>::between(1, 128));
    v.field("width", width, "width of its layers", Range<int64_t>::between(1, 8192));
    v.field("batch", batch, "samples", Range<int64_t>::at_least(1));
    v.field("loss_exponents", loss_exponents, "loss multiplied by 10^e, one row per e", Range<int64_t>::between(-30, 10));
  }
};

struct OverflowConfig {
  bool enabled = true;
  int64_t steps = 10, growth_interval = 3;
  std::vector<int64_t> overflow_at = {2, 3};
  template <class V> void fields(V& v) {
    v.field("enabled", enabled, "trace the loss scale through injected overflows");
    v.field("steps", steps, "steps traced", Range<int64_t>::between(1, 1000));
    v.field("overflow_at", overflow_at, "steps whose loss spikes (x 1e38: inf once scaled)", Range<int64_t>::at_least(0));
    v.field("growth_interval", growth_interval, "clean steps before the scale doubles (PyTorch's 2000: too long to watch)",
            Range<int64_t>::at_least(1));
  }
};

struct AmpLabConfig {
  std::vector<std::string> precisions = {"fp32", "tf32", "fp16-mixed", "bf16-mixed"};
  std::vector<std::string> models = {"mlp", "cnn"};
  bool scaler_cost = true, plots = true, dtypes = true;
  MlpConfig mlp;
  CnnConfig cnn;
  BenchConfig bench;
  UnderflowConfig underflow;
  OverflowConfig overflow;
  template <class V> void fields(V& v) {
    v.field("precisions", precisions, "precisions to compare, in order", amplab::enum_choices<Precision>());
    v.field("models", models, "models to train", {"mlp", "cnn"});
    v.field("scaler_cost", scaler_cost, "also time fp16-mixed without the GradScaler: the difference is its cost");
    v.field("plots", plots, "write precision.png (needs matplotlib)");
    v.field("dtypes", dtypes, "the dtype census: the dtype of each tensor of a small step under autocast, per precision");
    v.section("mlp", mlp);
    v.section("cnn", cnn);
    v.section("bench", bench);
    v.section("underflow", underflow);
    v.section("overflow", overflow);
  }
};

struct AmpConfig {
  amplab::RunConfig run;
  // train.fast_path here: PyTorch's fused SGD (one kernel; with fp16 the scaler skips on the device).
  amplab::StepSettings train;
  AmpLabConfig amp;
  template <class V> void fields(V& v) {
    v.section("run", run);
    v.section("train", train);
    v.section("amp", amp);
  }
};

}  // namespace amp_training
