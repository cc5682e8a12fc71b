// Lab 2, AMP training: the same models trained with your GradScaler and train_step (through the
// core's trainer, which is handed them) in fp32, tf32, fp16-mixed and
// bf16-mixed; time per step, throughput, TFLOP/s against the tensor cores' peak, memory and
// final loss side by side; then why fp16 needs loss scaling (gradient underflow) and what the
// scaler does when a step overflows.
//   build/bin/amp_training [--config configs/amp_training.yaml] [--set key=value ...]
#include <torch/torch.h>

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#ifdef AMPLAB_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <cmath>
#include <iostream>
#include <optional>

#include "amp_training.hpp"
#include "mechanisms.hpp"
#include "amplab/infra/app.hpp"
#include "amplab/infra/device.hpp"
#include "amplab/fast/fast_path.hpp"
#include "amplab/measure/fits.hpp"
#include "amplab/infra/log.hpp"
#include "amplab/measure/memory.hpp"
#include "amplab/report/plots.hpp"
#include "amplab/train/precision.hpp"
#include "amplab/report/report.hpp"
#include "amplab/report/run_dir.hpp"
#include "amplab/report/table.hpp"
#include "amplab/measure/timing.hpp"

namespace {

using amplab::Precision;

// ---- Config -----------------------------------------------------------------------------------

struct MlpConfig {
  int64_t width = 8192;     // features in and out of every Linear
  int64_t layers = 4;       // Linear(width, width) layers, ReLU between them
  int64_t batch = 8192;     // samples per step
  int64_t cpu_width = 512;  // the same on the CPU, where a GPU-sized step takes minutes
  int64_t cpu_batch = 256;

  template <class V>
  void fields(V& v) {
    v.field("width", width, "features of every Linear(width, width)", amplab::Range<int64_t>::between(1, 65536));
    v.field("layers", layers, "number of Linear layers", amplab::Range<int64_t>::between(1, 64));
    v.field("batch", batch, "samples per step", amplab::Range<int64_t>::at_least(1));
    v.field("cpu_width", cpu_width, "width on the CPU", amplab::Range<int64_t>::between(1, 65536));
    v.field("cpu_batch", cpu_batch, "batch on the CPU", amplab::Range<int64_t>::at_least(1));
  }
};

struct CnnConfig {
  int64_t channels = 64;      // of the first convolution; each of the next two doubles it
  int64_t image_size = 32;    // height and width of the synthetic 3-channel images
  int64_t classes = 10;
  int64_t batch = 512;        // samples per step
  int64_t cpu_batch = 32;     // on the CPU
  bool channels_last = true;  // GPU: NHWC weights and activations (cuDNN's fast layout for tensor cores)

  template <class V>
  void fields(V& v) {
    v.field("channels", channels, "channels of the first convolution", amplab::Range<int64_t>::between(1, 4096));
    v.field("image_size", image_size, "image height = width", amplab::Range<int64_t>::between(4, 1024));
    v.field("classes", classes, "output classes", amplab::Range<int64_t>::between(2, 100000));
    v.field("batch", batch, "samples per step", amplab::Range<int64_t>::at_least(1));
    v.field("cpu_batch", cpu_batch, "batch on the CPU", amplab::Range<int64_t>::at_least(1));
    v.field("channels_last", channels_last, "GPU: channels-last memory format");
  }
};

struct BenchConfig {
  int warmup = 3;              // untimed steps first (cuBLAS/cuDNN set-up, allocator warm-up)
  int repeats = 10;            // timed windows: median and IQR are over these
  int window = 5;              // steps per window, timed together with CUDA events
  int cpu_warmup = 1;          // the same on the CPU
  int cpu_repeats = 5;
  int cpu_window = 2;
  int64_t peak_n = 8192;       // n of the bf16 n x n x n matmul that measures the peak
  int64_t cpu_peak_n = 1024;

  template <class V>
  void fields(V& v) {
    v.field("warmup", warmup, "untimed steps before timing", amplab::Range<int64_t>::at_least(0));
    v.field("repeats", repeats, "timed windows (median and IQR over these)", amplab::Range<int64_t>::at_least(1));
    v.field("window", window, "steps per timed window", amplab::Range<int64_t>::at_least(1));
    v.field("cpu_warmup", cpu_warmup, "untimed steps on the CPU", amplab::Range<int64_t>::at_least(0));
    v.field("cpu_repeats", cpu_repeats, "timed windows on the CPU", amplab::Range<int64_t>::at_least(1));
    v.field("cpu_window", cpu_window, "steps per window on the CPU", amplab::Range<int64_t>::at_least(1));
    v.field("peak_n", peak_n, "n of the bf16 peak matmul", amplab::Range<int64_t>::between(16, 32768));
    v.field("cpu_peak_n", cpu_peak_n, "n of the peak matmul on the CPU", amplab::Range<int64_t>::between(16, 32768));
  }
};

struct UnderflowConfig {
  bool enabled = true;
  int64_t depth = 8;    // Linear(width, width) + tanh layers: a deep, narrow net
  int64_t width = 256;
  int64_t batch = 256;
  std::vector<int64_t> loss_exponents = {0, -2, -3, -4};  // the loss times 10^e: smaller and smaller gradients

  template <class V>
  void fields(V& v) {
    v.field("enabled", enabled, "show how many fp16 gradients flush to zero with and without loss scaling");
    v.field("depth", depth, "hidden layers of the deep narrow net", amplab::Range<int64_t>::between(1, 128));
    v.field("width", width, "width of its layers", amplab::Range<int64_t>::between(1, 8192));
    v.field("batch", batch, "samples", amplab::Range<int64_t>::at_least(1));
    v.field("loss_exponents", loss_exponents, "loss multiplied by 10^e, one row per e", amplab::Range<int64_t>::between(-30, 10));
  }
};

struct OverflowConfig {
  bool enabled = true;
  int64_t steps = 10;                         // steps traced
  std::vector<int64_t> overflow_at = {2, 3};  // steps whose loss spikes (x 1e38): inf once scaled
  int64_t growth_interval = 3;                // clean steps before the scale doubles (PyTorch: 2000, too long to watch)

  template <class V>
  void fields(V& v) {
    v.field("enabled", enabled, "trace the loss scale through injected overflows");
    v.field("steps", steps, "steps traced", amplab::Range<int64_t>::between(1, 1000));
    v.field("overflow_at", overflow_at, "steps with an injected overflow", amplab::Range<int64_t>::at_least(0));
    v.field("growth_interval", growth_interval, "clean steps before the scale grows", amplab::Range<int64_t>::at_least(1));
  }
};

// What the step needs from the trainer config (precision and loss scaling are set per row).
struct StepSettings {
  double grad_clip_norm = 0.0;  // clip the gradients' 2-norm to this (0: off)
  bool fast_path = false;       // here: PyTorch's fused SGD (one kernel; with fp16 the scaler skips on the device)
  amplab::OptimizerConfig optimizer;
  amplab::GradScalerConfig grad_scaler;

  template <class V>
  void fields(V& v) {
    v.field("grad_clip_norm", grad_clip_norm, "clip the gradient 2-norm to this (0: off)", amplab::Range<double>::at_least(0));
    v.field("fast_path", fast_path, amplab::kFastPathDescription);
    v.section("optimizer", optimizer);
    v.section("grad_scaler", grad_scaler);
  }
};

struct AmpLabConfig {
  std::vector<std::string> precisions = {"fp32", "tf32", "fp16-mixed", "bf16-mixed"};  // compared, in order
  std::vector<std::string> models = {"mlp", "cnn"};
  bool scaler_cost = true;  // also time fp16-mixed without the scaler: the difference is its cost
  bool plots = true;        // precision.png (needs matplotlib)
  MlpConfig mlp;
  CnnConfig cnn;
  BenchConfig bench;
  UnderflowConfig underflow;
  OverflowConfig overflow;

  template <class V>
  void fields(V& v) {
    v.field("precisions", precisions, "precisions to compare", amplab::enum_choices<Precision>());
    v.field("models", models, "models to train", {"mlp", "cnn"});
    v.field("scaler_cost", scaler_cost, "also time fp16-mixed without the GradScaler");
    v.field("plots", plots, "write precision.png (needs matplotlib)");
    v.section("mlp", mlp);
    v.section("cnn", cnn);
    v.section("bench", bench);
    v.section("underflow", underflow);
    v.section("overflow", overflow);
  }
};

struct AmpConfig {
  amplab::RunConfig run;
  StepSettings train;
  AmpLabConfig amp;
  template <class V>
  void fields(V& v) {
    v.section("run", run);
    v.section("train", train);
    v.section("amp", amp);
  }
};

// ---- The models -------------------------------------------------------------------------------

// (N, width) -> (N, width): `layers` x Linear(width, width), ReLU between them. Compute-bound at
// width 8192: each Linear is an 8192^3 matmul per 8192 samples.
struct WideMlpImpl : torch::nn::Module {
  std::vector<torch::nn::Linear> linears;
  WideMlpImpl(int64_t width, int64_t layers) {
    for (int64_t i = 0; i < layers; ++i)
      linears.push_back(register_module("fc" + std::to_string(i + 1), torch::nn::Linear(width, width)));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (size_t i = 0; i < linears.size(); ++i) {
      x = linears[i]->forward(x);
      if (i + 1 < linears.size()) x = torch::relu(x);
    }
    return x;
  }
};
TORCH_MODULE(WideMlp);

// FLOPs of one training step: forward 2*B*in*out per Linear, backward twice that (input and
// weight gradients): 6*B*in*out, biases neglected. The first layer's input gradient is never
// computed (the input needs none), so the hardware does 11/12 of this for 4 layers; the count is
// the usual "6 x batch x parameters" convention of the reference numbers.
double mlp_step_flops(int64_t batch, int64_t width, int64_t layers) {
  return 6.0 * static_cast<double>(batch) * static_cast<double>(width) * static_cast<double>(width) *
         static_cast<double>(layers);
}

// (N, 3, S, S) -> (N, classes): three 3x3 convolutions (c, 2c, 4c channels; the last two with
// stride 2), ReLU after each, global average pooling, Linear(4c, classes).
struct SmallCnnImpl : torch::nn::Module {
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  torch::nn::Linear fc{nullptr};
  SmallCnnImpl(int64_t c, int64_t classes) {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, c, /*kernel_size=*/3).padding(1)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(c, 2 * c, 3).stride(2).padding(1)));
    conv3 = register_module("conv3", torch::nn::Conv2d(torch::nn::Conv2dOptions(2 * c, 4 * c, 3).stride(2).padding(1)));
    fc = register_module("fc", torch::nn::Linear(4 * c, classes));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(conv1(x));
    x = torch::relu(conv2(x));
    x = torch::relu(conv3(x));
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);  // (N, 4c)
    return fc(x);
  }
};
TORCH_MODULE(SmallCnn);

// Python's model.to(memory_format=torch.channels_last): 4-d weights in NHWC order.
void to_channels_last(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters())
    if (p.dim() == 4) p.set_data(p.data().contiguous(torch::MemoryFormat::ChannelsLast));
}

// A model, its data and its loss, on the device; `initial` keeps the starting parameters on the
// host so that every precision starts from the same weights.
struct Workload {
  std::string name;
  std::shared_ptr<torch::nn::Module> model;
  std::vector<torch::Tensor> initial;  // host copies of the parameters
  amplab::Batch batch;                 // one fixed, device-resident batch: the data path is not what is measured
  amplab::LossFn loss_fn;
  double flops_per_step = 0;           // 0: not counted
  std::string shape;                   // for the header line

  void reset() {
    torch::NoGradGuard no_grad;
    auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(initial[i]);
  }
};

// The MLP's weights are made on the CPU; on the CPU its step also needs their gradients and the
// (B, width) input and target. A size that cannot fit is refused before the run starts, naming
// the keys, rather than by the allocator half-way.
void require_mlp_memory(const AmpLabConfig& lab, torch::Device device) {
  if (std::find(lab.models.begin(), lab.models.end(), "mlp") == lab.models.end()) return;
  const int64_t width = device.is_cuda() ? lab.mlp.width : lab.mlp.cpu_width;
  const double batch = static_cast<double>(device.is_cuda() ? lab.mlp.batch : lab.mlp.cpu_batch), w = static_cast<double>(width);
  const double params = static_cast<double>(lab.mlp.layers) * (w * w + w);
  const double cpu_bytes = 4.0 * (device.is_cuda() ? params : 2.0 * params + 2.0 * batch * w);
  amplab::require_cpu_memory(static_cast<int64_t>(std::min(cpu_bytes, 9e18)),
                             "the mlp workload, " + std::to_string(lab.mlp.layers) + " x Linear(" + std::to_string(width) +
                                 ", " + std::to_string(width) + "),",
                             device.is_cuda() ? "amp.mlp.width or amp.mlp.layers"
                                              : "amp.mlp.cpu_width, amp.mlp.layers or amp.mlp.cpu_batch");
}

Workload make_workload(const std::string& name, const AmpLabConfig& lab, torch::Device device, uint64_t seed) {
  torch::manual_seed(seed);
  Workload w;
  w.name = name;
  auto options = torch::TensorOptions().device(device);
  if (name == "mlp") {
    int64_t width = device.is_cuda() ? lab.mlp.width : lab.mlp.cpu_width;
    int64_t batch = device.is_cuda() ? lab.mlp.batch : lab.mlp.cpu_batch;
    WideMlp net(width, lab.mlp.layers);
    w.model = net.ptr();
    w.batch = {torch::randn({batch, width}, options), torch::randn({batch, width}, options)};  // (B, width) in, target
    // The benchmark times the step, so its loss is the cheapest that trains every layer: the sum
    // of the outputs over the batch size, read once and accumulated in fp32 with autocast off
    // (under autocast a reduction first writes an fp32 copy of the whole (B, width) output, and a
    // squared error against a target reads another 256 MiB). dL/dy = 1/B stays in fp16's normal
    // range. The Python reference (bench/mlp_step_parts.py) times the same loss.
    w.loss_fn = [net, batch, device](const amplab::Batch& b) mutable {
      torch::Tensor out = net->forward(b.input);
      amplab::AutocastGuard off(device.type(), at::autocast::get_autocast_dtype(device.type()), /*enabled=*/false);
      return out.sum(torch::kFloat32) / static_cast<double>(batch);
    };
    w.flops_per_step = mlp_step_flops(batch, width, lab.mlp.layers);
    w.shape = std::to_string(lab.mlp.layers) + " x Linear(" + std::to_string(width) + ", " + std::to_string(width) +
              "), batch " + std::to_string(batch);
  } else {
    int64_t batch = device.is_cuda() ? lab.cnn.batch : lab.cnn.cpu_batch;
    SmallCnn net(lab.cnn.channels, lab.cnn.classes);
    w.model = net.ptr();
    auto images = torch::randn({batch, 3, lab.cnn.image_size, lab.cnn.image_size}, options);
    bool channels_last = lab.cnn.channels_last && device.is_cuda();
    if (channels_last) images = images.contiguous(torch::MemoryFormat::ChannelsLast);
    w.batch = {images, torch::randint(0, lab.cnn.classes, {batch}, options.dtype(torch::kInt64))};
    w.loss_fn = [net](const amplab::Batch& b) mutable {
      return torch::nn::functional::cross_entropy(net->forward(b.input), b.target);
    };
    w.shape = "3 conv (" + std::to_string(lab.cnn.channels) + "-" + std::to_string(4 * lab.cnn.channels) +
              " channels) + Linear, " + std::to_string(lab.cnn.image_size) + "x" + std::to_string(lab.cnn.image_size) +
              " images, batch " + std::to_string(batch) + (channels_last ? ", channels-last" : "");
    if (channels_last) {
      w.model->to(device);
      to_channels_last(*w.model);
    }
  }
  for (const auto& p : w.model->parameters()) w.initial.push_back(p.detach().to(torch::kCPU).clone());
  w.model->to(device);
  return w;
}

// ---- Measuring ----------------------------------------------------------------------------------

// Speed and memory of one precision.
struct StepStats {
  amplab::Summary step_ms;  // milliseconds per step: one sample per timed window (window time / steps)
  double peak_mib = 0;      // peak memory from warm-up to the end (GPU: allocated by tensors; CPU: process RSS)
  double final_loss = NAN;  // loss of the last step
};

// `warmup` untimed steps, then `repeats` windows of `window` steps queued back to back as a
// training loop runs them (no host sync inside a window), each window timed as a whole.
StepStats measure_steps(const std::function<torch::Tensor()>& step, torch::Device device, int warmup, int repeats,
                        int window) {
  StepStats stats;
  amplab::reset_peak_memory(device);
  torch::Tensor loss;
  for (int i = 0; i < warmup; ++i) loss = step();
  amplab::synchronize(device);
  stats.step_ms = amplab::summarize(amplab::time_back_to_back([&] { loss = step(); }, device, window, repeats));
  stats.peak_mib = static_cast<double>(amplab::read_memory(device).peak_allocated) / (1 << 20);
  stats.final_loss = loss.item<double>();  // one host sync, at the end
  return stats;
}

// One row of the comparison: a model trained in one precision.
struct PrecisionResult {
  std::string model;  // "mlp" or "cnn"
  Precision precision = Precision::fp32;
  bool loss_scaling = false;  // the GradScaler was enabled
  bool ran = false;
  std::string skipped_because;  // why it did not run ("" when it ran)
  StepStats stats;
  double samples_per_second = 0;
  double tflops = 0;           // achieved TFLOP/s (0 where the FLOPs are not counted)
  double peak_fraction = 0;    // tflops / the tensor cores' peak (else the measured matmul peak)
  double speedup_vs_fp32 = 0;  // fp32's median ms / this median ms (0: no fp32 to compare)
  double memory_vs_fp32 = 0;   // this peak / fp32's peak (0: no fp32 to compare)
  std::string label() const {  // "bf16-mixed", "fp16-mixed (no scaler)"
    std::string name = amplab::to_string(precision);
    if (amplab::needs_loss_scaling(precision) && !loss_scaling) name += " (no scaler)";
    if (!amplab::needs_loss_scaling(precision) && loss_scaling) name += " (scaler)";
    return name;
  }
};

// Speed-up and memory of every result against the fp32 result of the same model (0: none ran).
void compare_to_fp32(std::vector<PrecisionResult>& results) {
  for (auto& r : results) {
    if (!r.ran) continue;
    for (const auto& base : results) {
      if (!base.ran || base.model != r.model || base.precision != Precision::fp32) continue;
      if (r.stats.step_ms.median > 0) r.speedup_vs_fp32 = base.stats.step_ms.median / r.stats.step_ms.median;
      if (base.stats.peak_mib > 0) r.memory_vs_fp32 = r.stats.peak_mib / base.stats.peak_mib;
      break;
    }
  }
}

// ---- Measurements -------------------------------------------------------------------------------

// Throughput of a bf16 n x n x n matmul (TFLOP/s, median over windows): the ceiling the MLP's
// TFLOP/s are compared with.
double matmul_peak_tflops(torch::Device device, int64_t n, int warmup, int repeats, int window) {
  torch::NoGradGuard no_grad;
  auto options = torch::TensorOptions().dtype(torch::kBFloat16).device(device);
  torch::Tensor a = torch::randn({n, n}, options), b = torch::randn({n, n}, options), c = torch::empty({n, n}, options);
  for (int i = 0; i < warmup; ++i) at::mm_out(c, a, b);
  auto ms = amplab::time_back_to_back([&] { at::mm_out(c, a, b); }, device, window, repeats);  // ms per matmul
  double per_matmul = amplab::summarize(ms).median;
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / (per_matmul * 1e9);
}

// The tensor cores' dense bf16 peak at the GPU's highest SM clock: SMs x clock x FLOP per clock
// per SM. A bound no kernel can beat, unlike a timed matmul: a loop of big bf16 matmuls draws the
// card's whole power limit (700 W on an H200), which holds its clock below the maximum, while a
// training step's other kernels let the clock rise, so the step's matmuls can run faster than
// the loop's (measured on an H200: the MLP at 763 TFLOP/s, the 8192^3 loop at 709).
struct TensorCorePeak {
  double tflops = 0;        // 0: an architecture not listed below
  int sms = 0;
  double max_mhz = 0;
  int flops_per_clock = 0;  // dense bf16 FLOP per clock per SM
};

TensorCorePeak tensor_core_peak(torch::Device device) {
  TensorCorePeak peak;
#ifdef AMPLAB_WITH_CUDA
  if (!device.is_cuda()) return peak;
  int index = device.has_index() ? device.index() : 0;
  const auto* props = at::cuda::getDeviceProperties(index);
  // Dense bf16 with fp32 accumulation, from NVIDIA's datasheets divided by SMs x boost clock:
  // A100 312 TFLOP/s = 108 x 1.41 GHz x 2048; H100/H200 989 = 132 x 1.83 GHz x 4096; B200 8192.
  if (props->major == 8 && props->minor == 0) peak.flops_per_clock = 2048;
  if (props->major == 9 && props->minor == 0) peak.flops_per_clock = 4096;
  if (props->major == 10 && props->minor == 0) peak.flops_per_clock = 8192;
  int khz = 0;
  if (peak.flops_per_clock == 0 || cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, index) != cudaSuccess || khz <= 0)
    return TensorCorePeak{};
  peak.sms = props->multiProcessorCount;
  peak.max_mhz = khz / 1000.0;
  peak.tflops = static_cast<double>(peak.sms) * khz * 1e3 * peak.flops_per_clock / 1e12;
#endif
  return peak;
}

PrecisionResult run_precision(Workload& w, Precision precision, bool with_scaler, const AmpConfig& config,
                                            torch::Device device, double peak_tflops) {
  PrecisionResult r;
  r.model = w.name;
  r.precision = precision;
  r.loss_scaling = with_scaler && amplab::needs_loss_scaling(precision);
  std::string why;
  if (!amplab::is_supported(precision, device, &why)) {
    r.skipped_because = why;
    return r;
  }
  amplab::TrainConfig train;
  train.precision = precision;
  train.loss_scaling = with_scaler ? "auto" : "off";
  train.grad_clip_norm = config.train.grad_clip_norm;
  train.fast_path = config.train.fast_path;
  train.optimizer = config.train.optimizer;
  train.grad_scaler = config.train.grad_scaler;
  w.reset();
  const auto& bench = config.amp.bench;
  bool cpu = !device.is_cuda();
  {
    amplab::MemoryConfig untracked;  // the step alone: no per-phase readings
    untracked.track = false;
    amplab::Trainer trainer(w.model, w.loss_fn, train, device, amplab::course_mechanisms(), untracked,
                            amplab::make_fast_path_optimizer);
    r.loss_scaling = trainer.scaler().is_enabled();
    amplab::log::info("timing " + w.name + " " + r.label());
    r.stats = measure_steps([&] { return trainer.step(w.batch).loss; }, device,
                                          cpu ? bench.cpu_warmup : bench.warmup, cpu ? bench.cpu_repeats : bench.repeats,
                                          cpu ? bench.cpu_window : bench.window);
  }  // optimizer state and the scaler go before the next precision is measured
  r.ran = true;
  double seconds = r.stats.step_ms.median / 1e3;
  r.samples_per_second = static_cast<double>(w.batch.size()) / seconds;
  if (w.flops_per_step > 0) {
    r.tflops = w.flops_per_step / seconds / 1e12;
    if (peak_tflops > 0) r.peak_fraction = r.tflops / peak_tflops;
  }
  return r;
}

// A deep, narrow net whose gradients are small: the case loss scaling exists for.
struct DeepNarrowImpl : torch::nn::Module {
  std::vector<torch::nn::Linear> layers;
  torch::nn::Linear head{nullptr};
  DeepNarrowImpl(int64_t depth, int64_t width) {
    for (int64_t i = 0; i < depth; ++i)
      layers.push_back(register_module("fc" + std::to_string(i + 1), torch::nn::Linear(width, width)));
    head = register_module("head", torch::nn::Linear(width, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& layer : layers) x = torch::tanh(layer->forward(x));
    return head->forward(x);
  }
};
TORCH_MODULE(DeepNarrow);

struct UnderflowRow {
  int64_t exponent = 0;       // the loss was multiplied by 10^exponent
  int64_t nonzero = 0;        // gradient elements non-zero in fp32
  double fp16_unscaled = 0;   // fraction of those that are zero in fp16 without loss scaling
  double fp16_scaled = 0;     // ... with the loss scaled by S
  double bf16 = 0;            // ... in bf16 (no scaling)
};

// The underflow table, with your gradients_under and flushed_share (TODO amp_training-8).
std::vector<UnderflowRow> underflow_report(const UnderflowConfig& c, double scale, torch::Device device, uint64_t seed) {
  torch::manual_seed(seed);
  DeepNarrow net(c.depth, c.width);
  net->to(device);
  amplab::Batch batch{torch::randn({c.batch, c.width}, device),
                      torch::randint(0, 10, {c.batch}, torch::TensorOptions().dtype(torch::kInt64).device(device))};
  std::vector<UnderflowRow> rows;
  for (int64_t e : c.loss_exponents) {
    double multiplier = std::pow(10.0, static_cast<double>(e));
    amplab::LossFn loss_fn = [&](const amplab::Batch& b) {
      return torch::nn::functional::cross_entropy(net->forward(b.input), b.target) * multiplier;
    };
    auto reference = amp_training::gradients_under(*net, loss_fn, batch, std::nullopt, 1.0, device);
    UnderflowRow row;
    row.exponent = e;
    for (const auto& g : reference) row.nonzero += (g != 0).sum().item<int64_t>();
    auto lost = [&](torch::ScalarType dtype, double loss_scale) {
      return amp_training::flushed_share(reference,
                                         amp_training::gradients_under(*net, loss_fn, batch, dtype, loss_scale, device));
    };
    row.fp16_unscaled = lost(torch::kHalf, 1.0);
    row.fp16_scaled = lost(torch::kHalf, scale);
    row.bf16 = lost(torch::kBFloat16, 1.0);
    rows.push_back(row);
  }
  return rows;
}

struct TraceRow {
  int64_t step = 0;
  bool overflow = false;       // a loss spike was injected
  double scale_before = 0;
  bool skipped = false;
  double scale_after = 0;
  int64_t growth_tracker = 0;  // clean steps since the last change of scale
  double update_norm = 0;      // 2-norm of the change of all parameters
};

// The loss scale through a few steps with injected overflows, driven by your train_step.
std::vector<TraceRow> overflow_trace(const OverflowConfig& c, const StepSettings& settings, Precision precision,
                                     torch::Device device, uint64_t seed) {
  torch::manual_seed(seed);
  auto net = std::make_shared<torch::nn::SequentialImpl>(torch::nn::Linear(64, 64), torch::nn::ReLU(), torch::nn::Linear(64, 10));
  net->to(device);
  amplab::Batch batch{torch::randn({32, 64}, device),
                      torch::randint(0, 10, {32}, torch::TensorOptions().dtype(torch::kInt64).device(device))};
  bool overflow = false;
  amplab::LossFn loss_fn = [&](const amplab::Batch& b) {
    auto loss = torch::nn::functional::cross_entropy(net->forward(b.input), b.target);
    return overflow ? loss * 1e38 : loss;  // finite in fp32; inf once multiplied by the loss scale
  };
  amplab::TrainConfig train;
  train.precision = precision;
  train.loss_scaling = "on";  // fp32 on the CPU: the scaler forced on behaves as it does for fp16
  train.fast_path = settings.fast_path;
  train.optimizer = settings.optimizer;
  train.grad_scaler = settings.grad_scaler;
  train.grad_scaler.growth_interval = c.growth_interval;
  amplab::Trainer training(net, loss_fn, train, device, amplab::course_mechanisms(), {}, amplab::make_fast_path_optimizer);
  const auto parameters = training.parameters();
  std::vector<TraceRow> rows;
  for (int64_t step = 0; step < c.steps; ++step) {
    TraceRow row;
    row.step = step;
    row.overflow = std::find(c.overflow_at.begin(), c.overflow_at.end(), step) != c.overflow_at.end();
    overflow = row.overflow;
    row.scale_before = training.scaler().get_scale();
    std::vector<torch::Tensor> before;
    for (const auto& p : parameters) before.push_back(p.detach().clone());
    auto result = training.step(batch);
    row.skipped = result.skipped.defined() && result.skipped.item<double>() > 0;
    row.scale_after = training.scaler().get_scale();
    row.growth_tracker = training.scaler().growth_tracker();
    double squares = 0;
    for (size_t i = 0; i < before.size(); ++i) squares += (parameters[i].detach() - before[i]).pow(2).sum().item<double>();
    row.update_norm = std::sqrt(squares);
    rows.push_back(row);
  }
  return rows;
}

std::string percent(double fraction, int decimals = 1) { return amplab::fixed(100.0 * fraction, decimals) + "%"; }

nlohmann::json to_json(const PrecisionResult& r) {
  return {{"model", r.model},
          {"precision", amplab::to_string(r.precision)},
          {"loss_scaling", r.loss_scaling},
          {"ran", r.ran},
          {"skipped_because", r.skipped_because},
          {"step_ms", {{"median", r.stats.step_ms.median}, {"q1", r.stats.step_ms.q1}, {"q3", r.stats.step_ms.q3},
                       {"iqr", r.stats.step_ms.iqr}, {"windows", r.stats.step_ms.count}}},
          {"samples_per_second", r.samples_per_second},
          {"tflops", r.tflops},
          {"peak_fraction", r.peak_fraction},
          {"peak_mib", r.stats.peak_mib},
          {"final_loss", r.ran ? nlohmann::json(r.stats.final_loss) : nlohmann::json()},
          {"speedup_vs_fp32", r.speedup_vs_fp32},
          {"memory_vs_fp32", r.memory_vs_fp32}};
}

}  // namespace

int main(int argc, char** argv) {
  return amplab::guarded_main([&]() -> int {
    AmpConfig config, defaults;
    amplab::CommandLine cli;
    if (auto code = amplab::parse_command_line(argc, argv, "amp_training", "Lab 2: AMP training, fp32 vs tf32 vs fp16 vs bf16",
                                               amplab::describe_keys(defaults), cli, /*accepts_resume=*/false))
      return *code;
    amplab::load_lab_config(cli, config);
    amplab::RunDir run = amplab::RunDir::create(config.run, "amp_training", amplab::to_yaml(config));
    amplab::apply_run_settings(config.run);
    torch::Device device = amplab::resolve_device(config.run.device);
    const auto& lab = config.amp;
    require_mlp_memory(lab, device);
    const auto seed = static_cast<uint64_t>(config.run.seed);
    const bool cpu = !device.is_cuda();
    if (device.is_cuda() && !config.run.deterministic) at::globalContext().setBenchmarkCuDNN(true);  // fastest conv kernels; warm-up absorbs the search
    std::cout << "== AMP training on " << amplab::describe(device) << " ==\n";
    amplab::log::info(amplab::describe_fast_path(config.train.fast_path, config.train.optimizer));
    if (cpu)
      std::cout << "(CPU run: small cpu_* sizes; fp16-mixed and tf32 need an NVIDIA GPU and are skipped here.\n"
                   " The numbers that matter come from a GPU: run this on a GPU machine.)\n";

    // 1. The ceiling: a bf16 matmul as large as the MLP's.
    int64_t peak_n = cpu ? lab.bench.cpu_peak_n : lab.bench.peak_n;
    // GPU: 200 untimed matmuls first (about 0.3 s on an H100/H200), so that a GPU that just woke up
    // has reached its clocks; a cold peak would put the MLP above 100% of it.
    double measured_matmul_peak = 0;  // set below when the tensor-core peak replaces it
    double peak = matmul_peak_tflops(device, peak_n, cpu ? 1 : std::max(lab.bench.warmup, 200), cpu ? 3 : lab.bench.repeats,
                                     cpu ? 1 : lab.bench.window);
    std::cout << "\n== Measured peak ==\nbf16 " << peak_n << "^3 matmul: " << amplab::fixed(peak, cpu ? 3 : 1) << " TFLOP/s\n";
    std::cout << std::flush;

    // 2. The same models in every precision, with your train_step.
    std::vector<PrecisionResult> results;
    nlohmann::json shapes;
    for (const auto& model_name : lab.models) {
      Workload w = make_workload(model_name, lab, device, seed);
      shapes[model_name] = w.shape;
      amplab::log::info(model_name + ": " + w.shape);
      for (const auto& name : lab.precisions) {
        Precision precision = amplab::enum_from_string<Precision>(name, "amp.precisions");
        results.push_back(run_precision(w, precision, /*with_scaler=*/true, config, device, peak));
        if (precision == Precision::fp16_mixed && lab.scaler_cost && results.back().ran)
          results.push_back(run_precision(w, precision, /*with_scaler=*/false, config, device, peak));
      }
    }
    compare_to_fp32(results);
    // The peak again, now that the GPU has run for a while at its working clocks: the best of the
    // two is the ceiling (timed cold, it once put the MLP at 108-114% of it).
    double peak_after = matmul_peak_tflops(device, peak_n, cpu ? 1 : lab.bench.warmup, cpu ? 3 : lab.bench.repeats,
                                           cpu ? 1 : lab.bench.window);
    std::cout << "bf16 " << peak_n << "^3 matmul after the runs: " << amplab::fixed(peak_after, cpu ? 3 : 1)
              << " TFLOP/s; the best of the two is the peak\n";
    peak = std::max(peak, peak_after);
    // What "% of peak" divides by: the tensor cores' peak where the architecture is known (no row
    // can exceed it), else the best of the two matmul timings.
    TensorCorePeak tensor_cores = tensor_core_peak(device);
    if (tensor_cores.tflops > 0) {
      std::cout << "tensor-core peak, dense bf16: " << tensor_cores.sms << " SMs x " << amplab::fixed(tensor_cores.max_mhz, 0)
                << " MHz x " << tensor_cores.flops_per_clock << " FLOP/clock = " << amplab::fixed(tensor_cores.tflops, 1)
                << " TFLOP/s; the matmul loop reached " << amplab::fixed(100 * peak / tensor_cores.tflops, 0)
                << "% of it (a loop of big matmuls draws the whole power limit, which holds the clock down).\n"
                << "\"% of peak\" below is of the tensor-core peak.\n";
      measured_matmul_peak = peak;
      peak = tensor_cores.tflops;
    } else {
      std::cout << "\"% of peak\" below is of the best of the two matmul timings ("
                << (device.is_cuda() ? "no tensor-core figure for this GPU's architecture" : "on the CPU") << ").\n";
    }
    for (auto& r : results)
      if (r.ran && r.tflops > 0 && peak > 0) r.peak_fraction = r.tflops / peak;

    amplab::Table table({"model", "precision", "scaler", "ms/step", "IQR ms", "samples/s", "TFLOP/s", "% of peak", "peak MiB",
                         "final loss", "speed-up", "memory vs fp32"});
    amplab::Table csv({"model", "precision", "loss_scaling", "ran", "step_ms_median", "step_ms_q1", "step_ms_q3",
                       "step_ms_iqr", "samples_per_s", "tflops", "peak_fraction", "peak_mib", "memory_source",
                       "final_loss", "speedup_vs_fp32", "memory_vs_fp32", "skipped_because"});
    std::string notes;
    nlohmann::json result_json = nlohmann::json::array();
    for (const auto& r : results) {
      result_json.push_back(to_json(r));
      const char* scaler = r.loss_scaling ? "on" : "off";
      if (!r.ran) {
        table.add_row({r.model, r.label(), "-", "-", "-", "-", "-", "-", "-", "-", "-", "skipped"});
        notes += "  " + r.model + " " + r.label() + ": skipped, " + r.skipped_because + "\n";
        csv.add_row({r.model, amplab::to_string(r.precision), scaler, "no", "", "", "", "", "", "", "", "", "", "", "", "",
                     r.skipped_because});
        continue;
      }
      bool counted = r.tflops > 0;
      table.add_row({r.model, r.label(), scaler, amplab::fixed(r.stats.step_ms.median, 3), amplab::fixed(r.stats.step_ms.iqr, 3),
                     amplab::fixed(r.samples_per_second, 0), counted ? amplab::fixed(r.tflops, cpu ? 3 : 1) : "-",
                     counted && r.peak_fraction > 0 ? percent(r.peak_fraction) : "-", amplab::fixed(r.stats.peak_mib, 0),
                     amplab::fixed(r.stats.final_loss, 4),
                     r.speedup_vs_fp32 > 0 ? amplab::fixed(r.speedup_vs_fp32, 2) + "x" : "-",
                     r.memory_vs_fp32 > 0 ? amplab::fixed(r.memory_vs_fp32, 2) + "x" : "-"});
      csv.add_row({r.model, amplab::to_string(r.precision), scaler, "yes", amplab::fixed(r.stats.step_ms.median, 4),
                   amplab::fixed(r.stats.step_ms.q1, 4), amplab::fixed(r.stats.step_ms.q3, 4), amplab::fixed(r.stats.step_ms.iqr, 4),
                   amplab::fixed(r.samples_per_second, 1), amplab::fixed(r.tflops, 3), amplab::fixed(r.peak_fraction, 4),
                   amplab::fixed(r.stats.peak_mib, 1), amplab::memory_is_rss(device) ? "cpu_rss" : "cuda_allocator",
                   amplab::fixed(r.stats.final_loss, 6), amplab::fixed(r.speedup_vs_fp32, 3), amplab::fixed(r.memory_vs_fp32, 3),
                   ""});
    }
    std::cout << "\n== Precisions (median of " << (cpu ? lab.bench.cpu_repeats : lab.bench.repeats) << " windows of "
              << (cpu ? lab.bench.cpu_window : lab.bench.window) << " steps after "
              << (cpu ? lab.bench.cpu_warmup : lab.bench.warmup) << " warm-up steps) ==\n";
    for (const auto& model_name : lab.models) std::cout << model_name << ": " << shapes[model_name].get<std::string>() << "\n";
    std::cout << table.to_string() << notes;
    std::cout << "memory: " << (amplab::memory_is_rss(device) ? "process RSS high-water mark (CPU; includes everything else)"
                                                                : "peak bytes allocated by tensors (CUDA caching allocator)")
              << "; TFLOP/s counted for the MLP only (6 x batch x in x out per Linear)\n";
    csv.write_csv(run.file("precision.csv"));

    // What the GradScaler costs: fp16-mixed with it against the plain autocast step without it.
    nlohmann::json scaler_json = nlohmann::json::object();
    for (const auto& with : results) {
      if (!with.ran || with.precision != Precision::fp16_mixed || !with.loss_scaling) continue;
      for (const auto& without : results) {
        if (!without.ran || without.model != with.model || without.precision != Precision::fp16_mixed || without.loss_scaling)
          continue;
        double cost = with.stats.step_ms.median - without.stats.step_ms.median;
        double fraction = cost / with.stats.step_ms.median;
        std::cout << "GradScaler cost, " << with.model << ": " << amplab::fixed(cost, 3) << " ms per step = "
                  << percent(fraction, 2) << " of the fp16-mixed step ("
                  << (config.train.fast_path ? "fused SGD: inf check and skip stay on the device"
                                             : "SGD not fused (train.fast_path=false): step() waits for the GPU to decide the skip")
                  << ")\n";
        scaler_json[with.model] = {{"ms", cost}, {"fraction", fraction}};
      }
    }

    // 3. Why fp16 needs loss scaling.
    nlohmann::json underflow_json = nlohmann::json::array();
    if (lab.underflow.enabled) {
      double scale = config.train.grad_scaler.init_scale;
      auto rows = underflow_report(lab.underflow, scale, device, seed);
      amplab::Table underflow({"loss x", "non-zero fp32 grads", "fp16, no scaling", "fp16, scale " + amplab::fixed(scale, 0), "bf16"});
      for (const auto& row : rows) {
        underflow.add_row({"1e" + std::to_string(row.exponent), std::to_string(row.nonzero), percent(row.fp16_unscaled, 2),
                           percent(row.fp16_scaled, 2), percent(row.bf16, 2)});
        underflow_json.push_back({{"loss_exponent", row.exponent}, {"nonzero_fp32", row.nonzero},
                                  {"fp16_unscaled", row.fp16_unscaled}, {"fp16_scaled", row.fp16_scaled}, {"bf16", row.bf16}});
      }
      std::cout << "\n== Gradient underflow: gradient elements non-zero in fp32 that are zero in fp16/bf16 ==\n"
                << lab.underflow.depth << " x (Linear(" << lab.underflow.width << ", " << lab.underflow.width
                << ") + tanh) + Linear, batch " << lab.underflow.batch << "; the loss is multiplied by 10^e to make small gradients\n"
                << underflow.to_string()
                << "fp16's smallest subnormal is 6e-8: smaller gradients flush to zero unless the loss is scaled up first;\n"
                   "bf16 has fp32's exponent range and needs no scaling.\n";
      underflow.write_csv(run.file("underflow.csv"));
    }

    // 4. The scaler through an overflow, driven by your train_step.
    nlohmann::json trace_json = nlohmann::json::array();
    if (lab.overflow.enabled) {
      Precision precision = cpu ? Precision::fp32 : Precision::fp16_mixed;
      auto rows = overflow_trace(lab.overflow, config.train, precision, device, seed);
      amplab::Table trace({"step", "overflow injected", "scale before", "step taken", "scale after", "clean steps", "|update|"});
      for (const auto& row : rows) {
        trace.add_row({std::to_string(row.step), row.overflow ? "yes" : "no", amplab::fixed(row.scale_before, 0),
                       row.skipped ? "skipped" : "taken", amplab::fixed(row.scale_after, 0), std::to_string(row.growth_tracker),
                       amplab::si(row.update_norm)});
        trace_json.push_back({{"step", row.step}, {"overflow", row.overflow}, {"scale_before", row.scale_before},
                              {"skipped", row.skipped}, {"scale_after", row.scale_after},
                              {"growth_tracker", row.growth_tracker}, {"update_norm", row.update_norm}});
      }
      std::cout << "\n== Loss scale through injected overflows (" << amplab::to_string(precision)
                << (cpu ? " with the scaler forced on: fp16 needs a GPU" : "") << ", growth_interval "
                << lab.overflow.growth_interval << ") ==\n"
                << trace.to_string()
                << "an overflow skips the step (parameters unchanged) and halves the scale; growth_interval clean steps double it.\n";
      trace.write_csv(run.file("overflow_trace.csv"));
    }

    run.write_summary({{"device", amplab::describe(device)},
                       {"peak", {{"dtype", "bf16"}, {"n", peak_n}, {"tflops", peak},
                                 {"kind", measured_matmul_peak > 0 ? "tensor_cores" : "matmul"},
                                 {"matmul_tflops", measured_matmul_peak > 0 ? measured_matmul_peak : peak}}},
                       {"models", shapes},
                       {"results", result_json},
                       {"scaler_cost", scaler_json},
                       {"underflow", underflow_json},
                       {"overflow_trace", trace_json},
                       {"fast_path", config.train.fast_path},
                       {"optimizer", {{"name", config.train.optimizer.name}, {"fused", config.train.fast_path}}}});
    std::cout << std::flush;  // before the plot script writes to the same stream
    if (lab.plots) amplab::make_plots("amp", run);
    amplab::write_report(run);
    std::cout << "\nresults: " << run.path() << "/ (precision.csv, underflow.csv, overflow_trace.csv, summary.json, precision.png)\n";
    return amplab::kExitOk;
  });
}
