// Lab 2, AMP training: the same models trained with your GradScaler and train_step (through the
// core's trainer, which is handed them) in fp32, tf32, fp16-mixed and bf16-mixed; time per step,
// throughput, TFLOP/s against the tensor cores' peak, memory and final loss side by side; then
// why fp16 needs loss scaling (gradient underflow) and what the scaler does when a step overflows.
//   build/bin/amp_training [--config configs/amp_training.yaml] [--set key=value ...]
#include <torch/torch.h>

#include <ATen/Context.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <optional>

#include "amp_training.hpp"
#include "amplab/fast/fast_path.hpp"
#include "amplab/infra/device.hpp"
#include "amplab/infra/log.hpp"
#include "amplab/lab_main.hpp"
#include "amplab/measure/fits.hpp"
#include "amplab/measure/memory.hpp"
#include "amplab/measure/peak.hpp"
#include "amplab/measure/timing.hpp"
#include "deep_narrow.hpp"
#include "dtype_census.hpp"
#include "amplab/report/table.hpp"
#include "amplab/train/precision.hpp"
#include "config.hpp"
#include "lab_identity.hpp"  // this_lab: labs/<lab>/lab.yaml
#include "workloads.hpp"

namespace {

using namespace amp_training;  // the lab's config, workloads and functions
using amplab::Precision;
using json = nlohmann::json;

using AmpLab = amplab::Lab<AmpConfig>;

// The MLP's weights are made on the CPU; on the CPU its step also needs their gradients and the
// (B, width) input and target. A size that cannot fit is refused before the run starts, naming
// the keys, rather than by the allocator half-way.
std::optional<int> require_mlp_memory(const AmpConfig& config, const amplab::ConfigSource&) {
  const auto& mlp = config.amp.mlp;
  if (std::find(config.amp.models.begin(), config.amp.models.end(), "mlp") == config.amp.models.end()) return {};
  const bool cpu = amplab::config_runs_on_cpu(config.run.device);
  const double w = static_cast<double>(mlp.width), params = static_cast<double>(mlp.layers) * (w * w + w);
  const double bytes = 4.0 * (cpu ? 2.0 * params + 2.0 * static_cast<double>(mlp.batch) * w : params);
  const std::string width = std::to_string(mlp.width);
  amplab::require_cpu_memory(static_cast<int64_t>(std::min(bytes, 9e18)),
                             "the mlp workload, " + std::to_string(mlp.layers) + " x Linear(" + width + ", " + width + "),",
                             cpu ? "amp.mlp.width, amp.mlp.layers or amp.mlp.batch" : "amp.mlp.width or amp.mlp.layers");
  return {};
}

// Throughput of a bf16 n x n x n matmul as large as the MLP's: the ceiling the MLP's TFLOP/s are
// compared with. On a GPU the first timing has 200 untimed matmuls first (about 0.3 s on an
// H100/H200), so that a GPU that just woke up has reached its clocks; a cold peak would put the
// MLP above 100% of it.
double matmul_peak_tflops(const AmpLab& lab, bool first) {
  const auto& bench = lab.config.amp.bench;
  const int warmup = lab.on_cpu() ? 1 : first ? std::max(bench.warmup, 200) : bench.warmup;
  return amplab::bf16_matmul_tflops(bench.peak_n, lab.device, warmup, lab.on_cpu() ? 1 : bench.window,
                                    lab.on_cpu() ? 3 : bench.repeats);
}

// The peak again, now that the GPU has run for a while at its working clocks: the best of the
// two is the ceiling (timed cold, it once put the MLP above 100% of it). "% of peak" divides by
// the tensor cores' bound at the highest SM clock where the architecture is known (no row can
// exceed it), else by that.
double settle_peak(AmpLab& lab, double cold) {
  const int decimals = lab.on_cpu() ? 3 : 1;
  lab.phase("peak");
  const double after = matmul_peak_tflops(lab, /*first=*/false), matmul = std::max(cold, after);
  std::cout << "bf16 " << lab.config.amp.bench.peak_n << "^3 matmul after the runs: " << amplab::fixed(after, decimals)
            << " TFLOP/s; the best of the two is the peak\n";
  const amplab::TensorCorePeak tc = amplab::tensor_core_peak(lab.device);
  if (tc.tflops > 0) {
    std::cout << "tensor-core peak, dense bf16, at the highest SM clock the driver reports: " << tc.sms << " SMs x "
              << amplab::fixed(tc.max_mhz, 0) << " MHz x " << tc.flops_per_clock << " FLOP/clock = "
              << amplab::fixed(tc.tflops, 1) << " TFLOP/s; the matmul loop reached " << amplab::fixed(100 * matmul / tc.tflops, 0)
              << "% of it (a loop of big matmuls draws the whole power limit, which holds the clock down).\n"
              << "\"% of peak\" below is of this tensor-core peak.\n";
  } else {
    std::cout << "\"% of peak\" below is of the best of the two matmul timings ("
              << (lab.on_cpu() ? "on the CPU" : "no tensor-core figure for this GPU's architecture") << ").\n";
  }
  const double peak = tc.tflops > 0 ? tc.tflops : matmul;
  lab.results.set("peak", {{"dtype", "bf16"}, {"n", lab.config.amp.bench.peak_n}, {"tflops", peak},
                           {"kind", tc.tflops > 0 ? "tensor_cores" : "matmul"}, {"matmul_tflops", matmul}});
  return peak;
}

// Every model in every precision (fp16-mixed also without its scaler), with your train_step: each
// row into `rows` as it finishes.
void run_precisions(AmpLab& lab, uint64_t seed, std::string& shapes, std::vector<PrecisionResult>& rows) {
  const auto& amp = lab.config.amp;
  json models;
  for (const auto& model_name : amp.models) {
    Workload w = amp_training::make_workload(model_name, amp, lab.device, seed);
    models[model_name] = w.shape;
    shapes += model_name + ": " + w.shape + "\n";
    amplab::log::info(model_name + ": " + w.shape);
    lab.results.set("models", models);
    for (const auto& name : amp.precisions) {
      Precision precision = amplab::enum_from_string<Precision>(name, "amp.precisions");
      lab.phase(model_name + " " + name);
      rows.push_back(run_precision(w, precision, /*with_scaler=*/true, lab.config, lab.device, amplab::make_fast_path_optimizer));
      if (precision != Precision::fp16_mixed || !amp.scaler_cost || !rows.back().ran()) continue;
      lab.phase(model_name + " " + name + " (no scaler)");
      rows.push_back(run_precision(w, precision, /*with_scaler=*/false, lab.config, lab.device, amplab::make_fast_path_optimizer));
    }
  }
}

// The comparison table: each row against the fp32 row of its model and against the peak.
void record_precisions(AmpLab& lab, const std::vector<PrecisionResult>& rows, double peak, const std::string& shapes) {
  using amplab::decimals;
  auto& table = lab.results.table(
      "precision", {{"model", "model"}, {"label", "precision"}, {"precision", ""},
                    {"loss_scaling", "scaler", [](const json& v) { return v.is_null() ? "-" : v.get<bool>() ? "on" : "off"; }},
                    {"ran", ""},
                    {"step_ms_median", "ms/step", decimals(3)}, {"step_ms_q1", ""}, {"step_ms_q3", ""},
                    {"step_ms_iqr", "IQR ms", decimals(3)}, {"windows", ""}, {"samples_per_s", "samples/s", decimals(0)},
                    {"tflops", "TFLOP/s", decimals(lab.on_cpu() ? 3 : 1)},
                    {"peak_fraction", "% of peak", amplab::percent_of_one(1)}, {"peak_mib", "peak MiB", decimals(0)},
                    {"memory_source", ""}, {"final_loss", "final loss", decimals(4)},
                    {"speedup_vs_fp32", "speed-up", amplab::times(2)},
                    {"memory_vs_fp32", "memory vs fp32", amplab::times(2)}, {"skipped_because", ""}});
  const std::string memory_source = amplab::memory_is_rss(lab.device) ? "cpu_rss" : "cuda_allocator";
  std::string notes;
  for (const auto& r : rows) {
    auto fp32 = std::find_if(rows.begin(), rows.end(),
                             [&](const auto& b) { return b.ran() && b.model == r.model && b.precision == Precision::fp32; });
    const bool vs_fp32 = r.ran() && fp32 != rows.end();
    auto measured = [&](json v) { return r.ran() ? v : json(); };  // null: the row did not run
    auto positive = [&](double v) { return r.ran() && v > 0 ? json(v) : json(); };  // null: not counted
    table.add({r.model, r.label(), amplab::to_string(r.precision), measured(r.loss_scaling), r.ran(), measured(r.step_ms.median),
               measured(r.step_ms.q1), measured(r.step_ms.q3), measured(r.step_ms.iqr), measured(r.step_ms.count),
               measured(r.samples_per_s), positive(r.tflops), positive(peak > 0 ? r.tflops / peak : 0),
               measured(r.peak_mib), measured(memory_source), measured(r.final_loss),
               positive(vs_fp32 ? fp32->step_ms.median / r.step_ms.median : 0),
               positive(vs_fp32 && fp32->peak_mib > 0 ? r.peak_mib / fp32->peak_mib : 0), r.skipped_because});
    if (!r.ran()) notes += "  " + r.model + " " + r.label() + ": skipped, " + r.skipped_because + "\n";
  }
  const auto& bench = lab.config.amp.bench;
  lab.results.print("precision",
                    "Precisions (median of " + std::to_string(bench.repeats) + " windows of " + std::to_string(bench.window) +
                        " steps after " + std::to_string(bench.warmup) + " warm-up steps)",
                    shapes + notes + "memory: " +
                        (amplab::memory_is_rss(lab.device) ? "process RSS high-water mark (CPU; includes everything else)"
                                                           : "peak bytes allocated by tensors (CUDA caching allocator)") +
                        "; TFLOP/s counted for the MLP only: 6 x batch x in x out per Linear, 4 x for the first "
                        "(its input gradient is never computed)\n");
}

// What the GradScaler costs: fp16-mixed with it against the plain autocast step without it.
void record_scaler_cost(AmpLab& lab, const std::vector<PrecisionResult>& rows) {
  json costs = json::object();
  for (const auto& with : rows)
    for (const auto& without : rows) {
      if (!with.ran() || !without.ran() || with.model != without.model || with.precision != Precision::fp16_mixed ||
          without.precision != Precision::fp16_mixed || !with.loss_scaling || without.loss_scaling)
        continue;
      const double cost = with.step_ms.median - without.step_ms.median, fraction = cost / with.step_ms.median;
      std::cout << "GradScaler cost, " << with.model << ": " << amplab::fixed(cost, 3) << " ms per step = "
                << amplab::fixed(100 * fraction, 2) << "% of the fp16-mixed step ("
                << (lab.config.train.fast_path ? "fused SGD: inf check and skip stay on the device"
                                               : "SGD not fused (train.fast_path=false): step() waits for the GPU to decide the skip")
                << ")\n";
      costs[with.model] = {{"ms", cost}, {"fraction", fraction}};
    }
  lab.results.set("scaler_cost", costs);
}

// The underflow table, with your gradients_under and flushed_share (TODO amp_training-8).
void record_underflow(AmpLab& lab, uint64_t seed) {
  const auto& c = lab.config.amp.underflow;
  const double scale = lab.config.train.grad_scaler.init_scale;
  lab.phase("underflow");
  auto percent = amplab::percent_of_one(2);
  auto& table = lab.results.table(
      "underflow", {{"loss_exponent", "loss x", [](const json& v) { return "1e" + std::to_string(v.get<int64_t>()); }},
                    {"nonzero_fp32", "non-zero fp32 grads", amplab::decimals(0)}, {"fp16_unscaled", "fp16, no scaling", percent},
                    {"fp16_scaled", "fp16, scale " + amplab::fixed(scale, 0), percent}, {"bf16", "bf16", percent}});
  torch::manual_seed(seed);
  amp_training::DeepNarrow net(c.depth, c.width);
  net->to(lab.device);
  amplab::Batch batch{torch::randn({c.batch, c.width}, lab.device),
                      torch::randint(0, 10, {c.batch}, torch::TensorOptions().dtype(torch::kInt64).device(lab.device))};
  for (int64_t e : c.loss_exponents) {
    const double multiplier = std::pow(10.0, static_cast<double>(e));
    amplab::LossFn loss_fn = [&](const amplab::Batch& b) {
      return torch::nn::functional::cross_entropy(net->forward(b.input), b.target) * multiplier;
    };
    auto gradients = [&](std::optional<torch::ScalarType> dtype, double loss_scale) {
      return amp_training::gradients_under(*net, loss_fn, batch, dtype, loss_scale, lab.device);
    };
    auto reference = gradients(std::nullopt, 1.0);
    int64_t nonzero = 0;
    for (const auto& g : reference) nonzero += (g != 0).sum().item<int64_t>();
    table.add({e, nonzero, amp_training::flushed_share(reference, gradients(torch::kHalf, 1.0)),
               amp_training::flushed_share(reference, gradients(torch::kHalf, scale)),
               amp_training::flushed_share(reference, gradients(torch::kBFloat16, 1.0))});
  }
  lab.results.print("underflow", "Gradient underflow: gradient elements non-zero in fp32 that are zero in fp16/bf16",
                    std::to_string(c.depth) + " x (Linear(" + std::to_string(c.width) + ", " + std::to_string(c.width) +
                        ") + tanh) + Linear, batch " + std::to_string(c.batch) +
                        "; the loss is multiplied by 10^e to make small gradients\n"
                        "fp16's smallest subnormal is 6e-8: smaller gradients flush to zero unless the loss is scaled up "
                        "first;\nbf16 has fp32's exponent range and needs no scaling.\n");
}

// The dtype census: each tensor of one small step under autocast, in each mixed precision the
// device runs ("-" where it does not).
void record_dtype_census(AmpLab& lab) {
  lab.phase("dtypes");
  const Precision precisions[] = {Precision::fp16_mixed, Precision::bf16_mixed};
  std::vector<std::vector<amp_training::CensusEntry>> columns;
  for (Precision p : precisions)
    columns.push_back(amplab::is_supported(p, lab.device) ? amp_training::autocast_dtype_census(lab.device, p)
                                                          : std::vector<amp_training::CensusEntry>{});
  auto& table = lab.results.table("autocast_dtypes", {{"tensor", "tensor"}, {"fp16_mixed", "fp16-mixed"},
                                                      {"bf16_mixed", "bf16-mixed"}});
  const auto& names = columns[0].empty() ? columns[1] : columns[0];
  for (size_t i = 0; i < names.size(); ++i) {
    auto dtype = [&](size_t c) { return columns[c].empty() ? json() : json(amp_training::dtype_name(columns[c][i].dtype)); };
    table.add({names[i].tensor, dtype(0), dtype(1)});
  }
  lab.results.print("autocast_dtypes",
                    "The dtype census: Linear(16, 10) -> ReLU -> LayerNorm -> Linear(10, 4), cross-entropy, on " +
                        amplab::describe(lab.device),
                    "forward and loss under autocast, backward outside it (as your train_step); '-': the precision "
                    "does not run on this device\n");
}

// The loss scale through a few steps with injected overflows, driven by your train_step. On the
// CPU, fp32 with the scaler forced on behaves as fp16's does.
void record_overflow_trace(AmpLab& lab, uint64_t seed) {
  const auto& c = lab.config.amp.overflow;
  const Precision precision = lab.on_cpu() ? Precision::fp32 : Precision::fp16_mixed;
  lab.phase("overflow trace");
  auto& table = lab.results.table(
      "overflow_trace", {{"step", "step", amplab::decimals(0)}, {"overflow", "overflow injected"},
                         {"scale_before", "scale before", amplab::decimals(0)},
                         {"skipped", "step taken", [](const json& v) { return v.get<bool>() ? "skipped" : "taken"; }},
                         {"scale_after", "scale after", amplab::decimals(0)}, {"growth_tracker", "clean steps", amplab::decimals(0)},
                         {"update_norm", "|update|", amplab::si_units()}});
  torch::manual_seed(seed);
  auto net = std::make_shared<torch::nn::SequentialImpl>(torch::nn::Linear(64, 64), torch::nn::ReLU(), torch::nn::Linear(64, 10));
  net->to(lab.device);
  amplab::Batch batch{torch::randn({32, 64}, lab.device),
                      torch::randint(0, 10, {32}, torch::TensorOptions().dtype(torch::kInt64).device(lab.device))};
  bool overflow = false;
  amplab::LossFn loss_fn = [&](const amplab::Batch& b) {
    auto loss = torch::nn::functional::cross_entropy(net->forward(b.input), b.target);
    return overflow ? loss * 1e38 : loss;  // finite in fp32; inf once multiplied by the loss scale
  };
  amplab::TrainConfig train = lab.config.train.for_row(precision, "on");
  train.grad_scaler.growth_interval = c.growth_interval;
  amplab::Trainer training(net, loss_fn, train, lab.device, {}, amplab::make_fast_path_optimizer);
  const auto parameters = training.parameters();
  for (int64_t step = 0; step < c.steps; ++step) {
    overflow = std::find(c.overflow_at.begin(), c.overflow_at.end(), step) != c.overflow_at.end();
    const double scale_before = training.scaler().get_scale();
    std::vector<torch::Tensor> before;
    for (const auto& p : parameters) before.push_back(p.detach().clone());
    auto result = training.step(batch);
    double squares = 0;
    for (size_t i = 0; i < before.size(); ++i) squares += (parameters[i].detach() - before[i]).pow(2).sum().item<double>();
    table.add({step, overflow, scale_before, result.skipped.defined() && result.skipped.item<double>() > 0,
               training.scaler().get_scale(), training.scaler().growth_tracker(), std::sqrt(squares)});
  }
  lab.results.print("overflow_trace",
                    "Loss scale through injected overflows (" + amplab::to_string(precision) +
                        (lab.on_cpu() ? " with the scaler forced on: fp16 needs a GPU" : "") + ", growth_interval " +
                        std::to_string(c.growth_interval) + ")",
                    "an overflow skips the step (parameters unchanged) and halves the scale; growth_interval clean steps "
                    "double it.\n");
}

}  // namespace

int main(int argc, char** argv) {
  const amplab::LabInfo info{amplab::this_lab::kName, amplab::this_lab::kTitle, /*accepts_resume=*/false,
                             "amp.mlp.width, amp.mlp.batch or amp.cnn.batch"};
  return amplab::lab_main<AmpConfig>(argc, argv, info, require_mlp_memory, [](AmpLab& lab) {
    const auto& amp = lab.config.amp;
    const auto seed = static_cast<uint64_t>(lab.config.run.seed);
    // cuDNN's fastest convolution kernels; the warm-up absorbs the search.
    if (!lab.on_cpu() && !lab.config.run.deterministic) at::globalContext().setBenchmarkCuDNN(true);
    amplab::log::info(amplab::describe_fast_path(lab.config.train.fast_path, lab.config.train.optimizer));
    if (lab.on_cpu())
      std::cout << "(CPU run: the sizes of the config's cpu: section; fp16-mixed and tf32 need an NVIDIA GPU and are "
                   "skipped here.\n The numbers that matter come from a GPU: run this on a GPU machine.)\n";
    // 1. The ceiling: a bf16 matmul as large as the MLP's.
    lab.phase("peak");
    const double cold_peak = matmul_peak_tflops(lab, /*first=*/true);
    std::cout << "\n== Measured peak ==\nbf16 " << amp.bench.peak_n << "^3 matmul: "
              << amplab::fixed(cold_peak, lab.on_cpu() ? 3 : 1) << " TFLOP/s\n" << std::flush;
    // 2. The same models in every precision, with your train_step.
    std::string shapes;
    std::vector<PrecisionResult> rows;
    double peak = cold_peak;
    amplab::run_then_record(
        [&] {
          run_precisions(lab, seed, shapes, rows);
          peak = settle_peak(lab, cold_peak);
        },
        [&] {
          record_precisions(lab, rows, peak, shapes);
          record_scaler_cost(lab, rows);
        });
    // 3. Why fp16 needs loss scaling. 4. The scaler through an overflow, driven by your train_step.
    if (amp.dtypes) record_dtype_census(lab);
    if (amp.underflow.enabled) record_underflow(lab, seed);
    if (amp.overflow.enabled) record_overflow_trace(lab, seed);
    lab.results.set("device", amplab::describe(lab.device));
    lab.results.set("fast_path", lab.config.train.fast_path);
    lab.results.set("optimizer", {{"name", lab.config.train.optimizer.name}, {"fused", lab.config.train.fast_path}});
    lab.draw_plots = amp.plots;
    return amplab::kExitOk;
  });
}
