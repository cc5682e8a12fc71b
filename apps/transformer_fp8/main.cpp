// Lab 7, transformers in low precision and FP8: a character-level GPT (nanoGPT's
// Shakespeare-char size on a GPU, a tiny one on the CPU) trained on Shakespeare in fp32, tf32,
// fp16 with and without lab 2's GradScaler, bf16, and bf16 with your FP8 linear layers; time per
// step, tokens/s, memory and validation loss side by side, with a loss-curve plot. Then the math
// attention (yours) against torch's fused SDPA, the FP8 MLP against bf16 (GPU), and a sample of
// generated text.
//   build/bin/transformer_fp8 [--config configs/transformer_fp8.yaml] [--set key=value ...]
#include <torch/torch.h>

#include <ATen/ops/_scaled_mm.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>

#include "amplab/infra/app.hpp"
#include "amplab/infra/device.hpp"
#include "amplab/infra/env.hpp"
#include "amplab/infra/files.hpp"
#include "amplab/infra/log.hpp"
#include "amplab/measure/memory.hpp"
#include "amplab/train/precision.hpp"
#include "amplab/report/report.hpp"
#include "amplab/report/run_dir.hpp"
#include "amplab/report/table.hpp"
#include "amplab/measure/timing.hpp"
#include "amplab/train/trainer.hpp"
#include "gpt.hpp"
#include "mechanisms.hpp"

namespace {

namespace lab = transformer_fp8;
using amplab::Precision;

// ---- Config -----------------------------------------------------------------------------------

struct GptSizes {
  int64_t n_layer = 6, n_head = 6, n_embd = 384, block_size = 256, batch = 64;
  template <class V>
  void fields(V& v) {
    v.field("n_layer", n_layer, "transformer blocks", amplab::Range<int64_t>::between(1, 96));
    v.field("n_head", n_head, "attention heads (n_embd must be a multiple)", amplab::Range<int64_t>::between(1, 128));
    v.field("n_embd", n_embd, "width C (FP8 on a GPU: a multiple of 16)", amplab::Range<int64_t>::between(8, 16384));
    v.field("block_size", block_size, "context length T", amplab::Range<int64_t>::between(4, 8192));
    v.field("batch", batch, "sequences per step (FP8 on a GPU: batch x block_size a multiple of 16)",
            amplab::Range<int64_t>::at_least(1));
  }
};

struct GptConfig {
  GptSizes gpu;                                               // nanoGPT's Shakespeare-char model
  GptSizes cpu{2, 4, 64, 64, 16};                             // about a minute for the whole CPU run
  double dropout = 0.2;
  std::string attention = "sdpa";                             // of the precision study
  std::string fp8_scaling = "dynamic";                        // of the fp8 row
  int64_t amax_history = 16;
  template <class V>
  void fields(V& v) {
    v.section("gpu", gpu);
    v.section("cpu", cpu);
    v.field("dropout", dropout, "dropout probability", amplab::Range<double>::between(0, 0.9));
    v.choice("attention", attention, {"math", "safe", "sdpa"}, "attention of the precision study");
    v.choice("fp8_scaling", fp8_scaling, {"dynamic", "delayed"}, "scaling of the fp8 row's linear layers");
    v.field("amax_history", amax_history, "steps of amax history (delayed scaling)", amplab::Range<int64_t>::between(1, 1024));
  }
};

struct StudyConfig {
  std::vector<std::string> rows = {"fp32", "tf32", "fp16", "fp16-no-scaler", "bf16", "fp8"};
  int64_t steps = 300, cpu_steps = 200;   // optimizer steps per row
  int64_t eval_every = 100, cpu_eval_every = 50;
  int64_t eval_iters = 20, cpu_eval_iters = 8;  // validation batches per evaluation
  int64_t warmup = 10;                    // steps left out of the timing
  bool attention_study = true;            // math vs safe vs SDPA
  int64_t attention_steps = 30, cpu_attention_steps = 10;
  bool fp8_mlp = true;                    // GPU: 4 x Linear(8192), batch 8192, FP8 against bf16
  int64_t sample_tokens = 300;
  bool plots = true;
  template <class V>
  void fields(V& v) {
    v.field("rows", rows, "precisions trained", {"fp32", "tf32", "fp16", "fp16-no-scaler", "bf16", "fp8"});
    v.field("steps", steps, "steps per row on a GPU", amplab::Range<int64_t>::at_least(1));
    v.field("cpu_steps", cpu_steps, "steps per row on the CPU", amplab::Range<int64_t>::at_least(1));
    v.field("eval_every", eval_every, "steps between validation losses (GPU)", amplab::Range<int64_t>::at_least(1));
    v.field("cpu_eval_every", cpu_eval_every, "steps between validation losses (CPU)", amplab::Range<int64_t>::at_least(1));
    v.field("eval_iters", eval_iters, "validation batches per evaluation (GPU)", amplab::Range<int64_t>::at_least(1));
    v.field("cpu_eval_iters", cpu_eval_iters, "validation batches per evaluation (CPU)", amplab::Range<int64_t>::at_least(1));
    v.field("warmup", warmup, "first steps left out of ms/step", amplab::Range<int64_t>::at_least(0));
    v.field("attention_study", attention_study, "time math, safe and SDPA attention");
    v.field("attention_steps", attention_steps, "steps per attention kind (GPU)", amplab::Range<int64_t>::at_least(2));
    v.field("cpu_attention_steps", cpu_attention_steps, "steps per attention kind (CPU)", amplab::Range<int64_t>::at_least(2));
    v.field("fp8_mlp", fp8_mlp, "GPU: the FP8 MLP table against bf16");
    v.field("sample_tokens", sample_tokens, "characters generated at the end (0: none)", amplab::Range<int64_t>::at_least(0));
    v.field("plots", plots, "write loss_curve.png (needs matplotlib)");
  }
};

struct DataConfig {
  std::string dir = "data/shakespeare";
  template <class V>
  void fields(V& v) {
    v.field("dir", dir, "train.txt and val.txt (scripts/fetch-shakespeare.py), or one text file", amplab::check_path_value);
  }
};

struct StepSettings {
  double grad_clip_norm = 1.0;
  amplab::OptimizerConfig optimizer;
  amplab::GradScalerConfig grad_scaler;
  template <class V>
  void fields(V& v) {
    v.field("grad_clip_norm", grad_clip_norm, "clip the gradient 2-norm to this (0: off)", amplab::Range<double>::at_least(0));
    v.section("optimizer", optimizer);
    v.section("grad_scaler", grad_scaler);
  }
};

struct LabConfig {
  amplab::RunConfig run;
  DataConfig data;
  StepSettings train;
  GptConfig gpt;
  StudyConfig study;
  template <class V>
  void fields(V& v) {
    v.section("run", run);
    v.section("data", data);
    v.section("train", train);
    v.section("gpt", gpt);
    v.section("study", study);
  }
};

// ---- One training run ---------------------------------------------------------------------------

// A row of the study: a precision, lab 2's loss scaling or not, and the kind of linear layers.
struct Variant {
  std::string name;
  Precision precision = Precision::fp32;
  bool scaler = true;
  lab::LinearKind linear = lab::LinearKind::plain;
};

Variant variant_of(const std::string& name) {
  if (name == "fp32") return {name, Precision::fp32};
  if (name == "tf32") return {name, Precision::tf32};
  if (name == "fp16") return {name, Precision::fp16_mixed};
  if (name == "fp16-no-scaler") return {name, Precision::fp16_mixed, false};
  if (name == "bf16") return {name, Precision::bf16_mixed};
  return {name, Precision::bf16_mixed, true, lab::LinearKind::fp8};
}

struct RunResult {
  std::string name, skipped_because;
  bool ran = false;
  double ms_per_step = 0, tokens_per_s = 0, peak_mib = 0;
  std::vector<int64_t> eval_steps;
  std::vector<double> val_losses, train_losses;
  lab::Gpt model{nullptr};
};

struct Setting {
  const lab::CharData* data;
  lab::GptOptions options;
  int64_t batch = 0, steps = 0, eval_every = 0, eval_iters = 0, warmup = 0;
  torch::Device device = torch::kCPU;
  uint64_t seed = 0;
};

// Mean validation loss over `eval_iters` batches, in eval mode and the row's autocast.
double validation_loss(lab::Gpt& model, const Setting& s, Precision precision) {
  torch::NoGradGuard no_grad;
  model->eval();
  amplab::AutocastGuard autocast(s.device, precision);
  double sum = 0;
  for (int64_t i = 0; i < s.eval_iters; ++i) {
    auto [x, y] = s.data->batch(s.data->val, s.batch, s.options.block_size, s.device);
    sum += model->loss(x, y).item<double>();
  }
  model->train();
  return sum / static_cast<double>(s.eval_iters);
}

amplab::TrainConfig train_config(const Variant& v, const StepSettings& settings) {
  amplab::TrainConfig train;
  train.precision = v.precision;
  train.loss_scaling = v.scaler ? "auto" : "off";
  train.grad_clip_norm = settings.grad_clip_norm;
  train.optimizer = settings.optimizer;
  train.grad_scaler = settings.grad_scaler;
  return train;
}

// Trains one row from the seed: lab 2's training step (autocast, GradScaler) through the core's
// trainer. ms/step counts the steps after `warmup`, with the device synchronized around the
// timed stretches; evaluations are left out of it.
RunResult train_row(const Variant& v, lab::GptOptions options, const Setting& s, const StepSettings& settings) {
  RunResult r;
  r.name = v.name;
  options.linear = v.linear;
  torch::manual_seed(s.seed);
  r.model = lab::Gpt(options);
  r.model->to(s.device);
  lab::Gpt model = r.model;
  amplab::LossFn loss_fn = [model](const amplab::Batch& b) mutable { return model->loss(b.input, b.target); };
  amplab::MemoryConfig untracked;
  untracked.track = false;
  amplab::Trainer trainer(r.model.ptr(), loss_fn, train_config(v, settings), s.device, amplab::course_mechanisms(), untracked);
  amplab::reset_peak_memory(s.device);
  double timed_ms = 0;
  int64_t timed_steps = 0;
  for (int64_t step = 1; step <= s.steps; ++step) {
    auto [x, y] = s.data->batch(s.data->train, s.batch, options.block_size, s.device);
    amplab::synchronize(s.device);
    auto start = std::chrono::steady_clock::now();
    torch::Tensor loss = trainer.step(amplab::Batch{x, y}).loss;
    amplab::synchronize(s.device);
    if (step > s.warmup) {
      timed_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      ++timed_steps;
    }
    if (step % s.eval_every == 0 || step == s.steps) {
      r.eval_steps.push_back(step);
      r.train_losses.push_back(loss.item<double>());
      r.val_losses.push_back(validation_loss(r.model, s, v.precision));
      amplab::log::info(v.name + " step " + std::to_string(step) + ": train " + amplab::fixed(r.train_losses.back(), 4) +
                        ", val " + amplab::fixed(r.val_losses.back(), 4));
    }
  }
  r.ran = true;
  r.ms_per_step = timed_steps > 0 ? timed_ms / static_cast<double>(timed_steps) : NAN;
  r.tokens_per_s = static_cast<double>(s.batch * options.block_size) / (r.ms_per_step / 1e3);
  r.peak_mib = static_cast<double>(amplab::read_memory(s.device).peak_allocated) / (1 << 20);
  return r;
}

// Why a row cannot run here ("" when it can).
std::string skip_reason(const Variant& v, torch::Device device, const lab::GptOptions& o, int64_t batch) {
  std::string why;
  if (!amplab::is_supported(v.precision, device, &why)) return why;
  if (v.linear == lab::LinearKind::fp8) {
    if (!device.is_cuda())
      return "FP8 matmuls: torch's CPU _scaled_mm is a reference kernel (about 1000x slower than fp32); needs an sm_89+ GPU";
    if (o.n_embd % 16 != 0 || (batch * o.block_size) % 16 != 0)
      return "FP8 on a GPU needs n_embd and batch x block_size multiples of 16";
    try {
      auto e4m3 = torch::ones({16, 16}, torch::TensorOptions().device(device)).to(torch::kFloat8_e4m3fn);
      auto one = torch::ones({}, torch::TensorOptions().device(device));
      at::_scaled_mm(e4m3, e4m3.t(), one, one, {}, {}, torch::kBFloat16);
    } catch (const std::exception&) {
      return "this GPU has no FP8 matmul (needs compute capability 8.9+: Ada, Hopper, Blackwell)";
    }
  }
  return "";
}

// ---- The FP8 MLP and matmul tables (GPU) ----------------------------------------------------------

struct MlpRow {
  std::string name;
  double ms = 0, tflops = 0;
};

// forward + backward of 4 x Linear(width) at `batch` rows in bf16 (autocast) or with FP8 linears
// (dynamic scaling); TFLOP/s counted as 6 x batch x width^2 per layer.
std::vector<MlpRow> fp8_mlp_table(torch::Device device, int64_t width, int64_t batch, int layers) {
  std::vector<MlpRow> rows;
  for (auto kind : {lab::LinearKind::plain, lab::LinearKind::fp8}) {
    torch::manual_seed(0);
    std::vector<lab::Float8Linear> linears;
    for (int i = 0; i < layers; ++i) {
      linears.emplace_back(width, width, kind, lab::Fp8Scaling::dynamic, 1);
      linears.back()->to(device);
    }
    torch::Tensor x = torch::randn({batch, width}, torch::TensorOptions().device(device));
    auto step = [&] {
      torch::Tensor y;
      {
        amplab::AutocastGuard autocast(device, Precision::bf16_mixed);
        y = x;
        for (auto& l : linears) y = torch::relu(l(y));
      }
      y.to(torch::kFloat32).mean().backward();
    };
    for (int i = 0; i < 3; ++i) step();
    double ms = amplab::summarize(amplab::time_back_to_back(step, device, 10, 3)).median;
    double flops = 6.0 * static_cast<double>(batch) * static_cast<double>(width * width) * layers;
    rows.push_back({kind == lab::LinearKind::fp8 ? "fp8 (your fp8_linear, dynamic)" : "bf16 (autocast)", ms, flops / ms / 1e9});
  }
  return rows;
}

// One (m, k, n) matmul: bf16 torch::mm against e4m3 _scaled_mm (tensorwise), TFLOP/s. The shapes:
// a large square one, a small one, and the GPT's qkv projection (64 x 256 tokens, 384 -> 1152).
struct MatmulTflops {
  double bf16 = 0, fp8 = 0, fp8_rowwise = NAN;  // NaN: rowwise refused here
};
MatmulTflops matmul_tflops(torch::Device device, int64_t m, int64_t k, int64_t n) {
  torch::NoGradGuard no_grad;
  auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16).device(device);
  torch::Tensor a = torch::randn({m, k}, bf16), b = torch::randn({n, k}, bf16);
  torch::Tensor a8 = a.to(torch::kFloat8_e4m3fn), b8 = b.to(torch::kFloat8_e4m3fn);
  torch::Tensor one = torch::ones({}, torch::TensorOptions().device(device));
  auto time_it = [&](const std::function<void()>& f) {
    for (int i = 0; i < 20; ++i) f();
    return amplab::summarize(amplab::time_back_to_back(f, device, 20, 5)).median;
  };
  double flops = 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n);
  MatmulTflops r;
  r.bf16 = flops / time_it([&] { torch::mm(a, b.t()); }) / 1e9;
  r.fp8 = flops / time_it([&] { at::_scaled_mm(a8, b8.t(), one, one, {}, {}, torch::kBFloat16); }) / 1e9;
  try {  // your rowwise casts (TODO 6): an (m, 1) and a (1, n) scale
    lab::Fp8Rowwise ar = lab::to_fp8_rowwise(a, lab::Fp8Format::e4m3), br = lab::to_fp8_rowwise(b, lab::Fp8Format::e4m3);
    torch::Tensor inv_a = ar.scale.reciprocal(), inv_b = br.scale.reciprocal().t();
    r.fp8_rowwise = flops / time_it([&] { at::_scaled_mm(ar.data, br.data.t(), inv_a, inv_b, {}, {}, torch::kBFloat16); }) / 1e9;
  } catch (const std::exception& e) {
    amplab::log::warn(std::string("rowwise FP8 matmul skipped: ") + e.what());
  }
  return r;
}

// ---- Output -------------------------------------------------------------------------------------

// labs/transformer_fp8/plot_loss.py <run dir>: loss_curve.png from losses.csv.
void plot_loss_curve(const amplab::RunDir& run) {
  namespace fs = std::filesystem;
  std::string venv_python = amplab::source_dir() + "/.venv/bin/python";
  std::string python = fs::exists(venv_python) ? venv_python : "python3";
  std::string script = amplab::source_dir() + "/labs/transformer_fp8/plot_loss.py";
  std::cout << std::flush;
  pid_t pid = fork();
  if (pid == 0) {
    execlp(python.c_str(), python.c_str(), script.c_str(), run.path().c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    amplab::log::warn("loss_curve.png skipped: " + python + " " + script + " failed (is matplotlib installed?)");
}

nlohmann::json to_json(const RunResult& r) {
  return {{"name", r.name},           {"ran", r.ran},
          {"skipped_because", r.skipped_because}, {"ms_per_step", r.ms_per_step},
          {"tokens_per_s", r.tokens_per_s}, {"peak_mib", r.peak_mib},
          {"eval_steps", r.eval_steps}, {"val_loss", r.val_losses}, {"train_loss", r.train_losses}};
}

// The precision table (printed, precision.csv) and every evaluation (losses.csv).
void write_precision_tables(const std::vector<RunResult>& results, const amplab::RunDir& run, bool cpu) {
  amplab::Table table({"row", "ms/step", "tokens/s", "peak MiB", "val loss (last)", "speed-up vs fp32"});
  amplab::Table losses({"row", "step", "train_loss", "val_loss"});
  double fp32_ms = 0;
  for (const auto& r : results)
    if (r.ran && r.name == "fp32") fp32_ms = r.ms_per_step;
  std::string notes;
  for (const auto& r : results) {
    if (!r.ran) {
      table.add_row({r.name, "-", "-", "-", "-", "skipped"});
      notes += "  " + r.name + ": skipped, " + r.skipped_because + "\n";
      continue;
    }
    table.add_row({r.name, amplab::fixed(r.ms_per_step, cpu ? 1 : 2), amplab::fixed(r.tokens_per_s, 0),
                   amplab::fixed(r.peak_mib, 0), amplab::fixed(r.val_losses.back(), 4),
                   fp32_ms > 0 ? amplab::fixed(fp32_ms / r.ms_per_step, 2) + "x" : "-"});
    for (size_t i = 0; i < r.eval_steps.size(); ++i)
      losses.add_row({r.name, std::to_string(r.eval_steps[i]), amplab::fixed(r.train_losses[i], 5),
                      amplab::fixed(r.val_losses[i], 5)});
  }
  std::cout << table.to_string() << notes
            << (cpu ? "peak MiB: the process's RSS high-water mark (on the CPU it only grows from row to row)\n"
                    : "peak MiB: the most bytes tensors held during the row (CUDA caching allocator)\n");
  table.write_csv(run.file("precision.csv"));
  losses.write_csv(run.file("losses.csv"));
}

}  // namespace

namespace {

// math (yours), safe (yours) and torch's SDPA inside the same GPT: ms/step and peak memory (the
// math paths hold the (B, H, T, T) scores and weights; SDPA's fused kernels never write them).
void attention_study(const Setting& base, const LabConfig& config, const amplab::RunDir& run, nlohmann::json& summary) {
  Variant v = variant_of(base.device.is_cuda() ? "bf16" : "fp32");
  Setting s = base;
  s.steps = base.device.is_cuda() ? config.study.attention_steps : config.study.cpu_attention_steps;
  s.eval_every = s.steps;
  s.warmup = std::min<int64_t>(config.study.warmup, s.steps / 2);
  amplab::Table table({"attention", "precision", "ms/step", "tokens/s", "peak MiB", "val loss"});
  for (const std::string kind : {"math", "safe", "sdpa"}) {
    lab::GptOptions options = s.options;
    options.attention = lab::attention_kind(kind);
    RunResult r = train_row(v, options, s, config.train);
    table.add_row({kind, v.name, amplab::fixed(r.ms_per_step, 2), amplab::fixed(r.tokens_per_s, 0),
                   amplab::fixed(r.peak_mib, 0), amplab::fixed(r.val_losses.back(), 4)});
    summary["attention"].push_back({{"attention", kind}, {"precision", v.name}, {"ms_per_step", r.ms_per_step},
                                    {"peak_mib", r.peak_mib}, {"val_loss", r.val_losses.back()}});
  }
  std::cout << "\n== Attention: your math path, your fp16-safe path, torch's SDPA (" << v.name << ", " << s.steps
            << " steps) ==\n"
            << table.to_string();
  table.write_csv(run.file("attention.csv"));
}

void fp8_tables(torch::Device device, const amplab::RunDir& run, nlohmann::json& summary) {
  auto mlp = fp8_mlp_table(device, 8192, 8192, 4);
  amplab::Table table({"4 x Linear(8192), batch 8192", "ms/step", "TFLOP/s", "vs bf16"});
  for (const auto& r : mlp) {
    table.add_row({r.name, amplab::fixed(r.ms, 2), amplab::fixed(r.tflops, 0), amplab::fixed(r.tflops / mlp[0].tflops, 2) + "x"});
    summary["fp8_mlp"].push_back({{"name", r.name}, {"ms_per_step", r.ms}, {"tflops", r.tflops}});
  }
  std::cout << "\n== FP8 MLP against bf16 (forward + backward; 6 x batch x width^2 FLOP per layer) ==\n"
            << table.to_string();
  table.write_csv(run.file("fp8_mlp.csv"));
  amplab::Table matmuls({"m x k x n", "bf16 TFLOP/s", "fp8 tensorwise TFLOP/s", "fp8 rowwise TFLOP/s", "tensorwise / bf16"});
  for (auto [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{8192, 8192, 8192}, {1024, 2048, 1024}, {16384, 384, 1152}}) {
    MatmulTflops t = matmul_tflops(device, m, k, n);
    std::string shape = std::to_string(m) + " x " + std::to_string(k) + " x " + std::to_string(n);
    matmuls.add_row({shape, amplab::fixed(t.bf16, 0), amplab::fixed(t.fp8, 0), amplab::fixed(t.fp8_rowwise, 0),
                     amplab::fixed(t.fp8 / t.bf16, 2) + "x"});
    summary["fp8_matmul"].push_back({{"shape", shape}, {"bf16_tflops", t.bf16}, {"fp8_tflops", t.fp8},
                                     {"fp8_rowwise_tflops", std::isnan(t.fp8_rowwise) ? nlohmann::json() : nlohmann::json(t.fp8_rowwise)}});
  }
  std::cout << "\n== One matmul: bf16 against FP8 (_scaled_mm, tensorwise, no cast counted) ==\n" << matmuls.to_string();
  matmuls.write_csv(run.file("fp8_matmul.csv"));
}

// Generated text from the row named first in `preferred` that ran.
void write_sample(std::vector<RunResult>& results, const lab::CharData& data, int64_t tokens, torch::Device device,
                  const amplab::RunDir& run, nlohmann::json& summary) {
  for (const std::string name : {"bf16", "fp32", "fp8", "tf32", "fp16"}) {
    for (auto& r : results) {
      if (!r.ran || r.name != name) continue;
      torch::Tensor prompt = data.encode("\n").view({1, 1}).to(device);
      std::string text = data.decode(lab::generate(r.model, prompt, tokens, /*temperature=*/0.8, /*top_k=*/20));
      std::cout << "\n== A sample from the " << name << " model (" << tokens << " characters, temperature 0.8) ==\n"
                << text << "\n";
      amplab::write_file_atomic(run.file("sample.txt"), text + "\n");
      summary["sample"] = {{"row", name}, {"text", text}};
      return;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  return amplab::guarded_main([&]() -> int {
    LabConfig config, defaults;
    amplab::CommandLine cli;
    if (auto code = amplab::parse_command_line(argc, argv, "transformer_fp8",
                                               "Lab 7: a GPT on Shakespeare in fp32, tf32, fp16, bf16 and FP8",
                                               amplab::describe_keys(defaults), cli, /*accepts_resume=*/false))
      return *code;
    amplab::load_lab_config(cli, config);
    lab::CharData data = lab::CharData::load(config.data.dir);  // before the run directory: a missing text is one line
    amplab::RunDir run = amplab::RunDir::create(config.run, "transformer_fp8", amplab::to_yaml(config));
    amplab::apply_run_settings(config.run);
    torch::Device device = amplab::resolve_device(config.run.device);
    const bool cpu = !device.is_cuda();
    const GptSizes& sizes = cpu ? config.gpt.cpu : config.gpt.gpu;
    lab::GptOptions options;
    options.vocab_size = static_cast<int64_t>(data.vocab.size());
    options.n_layer = sizes.n_layer;
    options.n_head = sizes.n_head;
    options.n_embd = sizes.n_embd;
    options.block_size = sizes.block_size;
    options.dropout = config.gpt.dropout;
    options.attention = lab::attention_kind(config.gpt.attention);
    options.scaling = lab::fp8_scaling(config.gpt.fp8_scaling);
    options.amax_history = config.gpt.amax_history;
    const auto& study = config.study;
    Setting s{&data, options, sizes.batch, cpu ? study.cpu_steps : study.steps, cpu ? study.cpu_eval_every : study.eval_every,
              cpu ? study.cpu_eval_iters : study.eval_iters, study.warmup, device, static_cast<uint64_t>(config.run.seed)};
    s.warmup = std::min(s.warmup, s.steps - 1);
    const int64_t params = lab::Gpt(options)->parameter_count();

    std::cout << "== A GPT on Shakespeare on " << amplab::describe(device) << " ==\n"
              << options.n_layer << " layers, " << options.n_head << " heads, width " << options.n_embd << ", context "
              << options.block_size << ", batch " << s.batch << " (" << s.batch * options.block_size << " tokens/step), "
              << amplab::fixed(params / 1e6, 2) << " M parameters, vocabulary " << options.vocab_size << ", "
              << data.train.numel() << " training characters; " << s.steps << " steps per row\n";
    if (cpu)
      std::cout << "(CPU run: the gpt.cpu sizes; skipped here: tf32, fp16, the fp8 row and the FP8 MLP and matmul tables,"
                   " which need an NVIDIA GPU.)\n";
    std::cout << std::flush;  // before the training logs (stderr)

    nlohmann::json summary = {{"device", amplab::describe(device)}, {"parameters", params},
                              {"tokens_per_step", s.batch * options.block_size}, {"steps", s.steps}};
    std::vector<RunResult> results;
    for (const auto& name : study.rows) {
      Variant v = variant_of(name);
      std::string why = skip_reason(v, device, options, s.batch);
      if (!why.empty()) {
        results.push_back(RunResult{name, why});
        continue;
      }
      amplab::log::info("training " + name);
      results.push_back(train_row(v, options, s, config.train));
    }
    std::cout << "\n== Precisions (" << s.steps << " steps each, ms/step over the steps after the first " << s.warmup
              << "; val loss over " << s.eval_iters << " batches) ==\n";
    write_precision_tables(results, run, cpu);
    for (const auto& r : results) summary["rows"].push_back(to_json(r));
    if (study.plots) plot_loss_curve(run);

    if (study.attention_study) attention_study(s, config, run, summary);
    bool fp8_here = skip_reason(variant_of("fp8"), device, options, s.batch).empty();
    if (study.fp8_mlp && fp8_here) fp8_tables(device, run, summary);
    if (study.sample_tokens > 0) write_sample(results, data, study.sample_tokens, device, run, summary);

    run.write_summary(summary);
    amplab::write_report(run);
    std::cout << "\nresults: " << run.path() << "/ (the tables as .csv, loss_curve.png, sample.txt, summary.json; report.md to answer)\n";
    return amplab::kExitOk;
  });
}
