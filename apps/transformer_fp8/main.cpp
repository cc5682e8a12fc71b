// Lab 7, transformers in low precision and FP8: a character-level GPT (nanoGPT's
// Shakespeare-char size on a GPU, a tiny one on the CPU) trained on Shakespeare in fp32, tf32,
// fp16 with and without lab 2's GradScaler, bf16, and bf16 with your FP8 linear layers; time per
// step, tokens/s, memory and validation loss side by side, with a loss-curve plot. Then the math
// attention (yours) against torch's fused SDPA, the FP8 MLP against bf16 (GPU), and a sample of
// generated text.
//   build/bin/transformer_fp8 [--config configs/transformer_fp8.yaml] [--set key=value ...]
#include <torch/torch.h>

#include <ATen/ops/_scaled_mm.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>
#include <tuple>
#include <utility>

#include "amplab/fast/fast_path.hpp"
#include "amplab/fast/fused_fp8_mlp.hpp"
#include "amplab/infra/device.hpp"
#include "amplab/infra/files.hpp"
#include "amplab/infra/log.hpp"
#include "amplab/lab_main.hpp"
#include "amplab/measure/memory.hpp"
#include "amplab/measure/timing.hpp"
#include "amplab/state/study_progress.hpp"
#include "amplab/report/table.hpp"
#include "amplab/train/precision.hpp"
#include "amplab/train/trainer.hpp"
#include "config.hpp"
#include "fp8_tables.hpp"
#include "fused_gpt.hpp"
#include "gpt.hpp"
#include "lab_identity.hpp"  // this_lab: labs/<lab>/lab.yaml

namespace {

namespace tf8 = transformer_fp8;
using amplab::Precision;
using tf8::GptConfig;
using tf8::LabConfig;
using tf8::StudyConfig;

using Lab = amplab::Lab<LabConfig>;

// ---- One training run ---------------------------------------------------------------------------

// A row of the study: a precision, lab 2's loss scaling or not, and the kind of linear layers.
struct Variant {
  std::string name;
  Precision precision = Precision::fp32;
  bool scaler = true;
  tf8::LinearKind linear = tf8::LinearKind::plain;
};

Variant variant_of(const std::string& name) {
  if (name == "fp32") return {name, Precision::fp32};
  if (name == "tf32") return {name, Precision::tf32};
  if (name == "fp16") return {name, Precision::fp16_mixed};
  if (name == "fp16-no-scaler") return {name, Precision::fp16_mixed, false};
  if (name == "bf16") return {name, Precision::bf16_mixed};
  return {name, Precision::bf16_mixed, true, tf8::LinearKind::fp8};
}

// What a training run reads: the text, the model, the batch, the schedule and the step.
struct Setting {
  const tf8::CharData* data;
  tf8::GptOptions options;
  int64_t batch, steps, eval_every, eval_iters, warmup;
  torch::Device device;
  uint64_t seed;
  amplab::StepSettings train;
  tf8::LrSchedule schedule;
  bool graph_steps = true;  // with train.fast_path on a GPU, the fused model and each step as one CUDA graph where it can be
};

struct CurvePoint {  // an evaluation during training
  int64_t step = 0;
  double train_loss = NAN, val_loss = NAN;
  double val_loss_se = NAN;  // the standard error of val_loss, the mean over eval_iters batches (NaN for one batch)
};

struct RunResult {  // NaN where the row did not run
  std::string name, skipped_because;
  std::string steps = "eager";  // or "CUDA graph"
  double ms_per_step = NAN, tokens_per_s = NAN, peak_mib = NAN, val_loss = NAN;  // the last validation loss
  double val_loss_se = NAN;      // its standard error
  std::vector<CurvePoint> curve;
  std::string sample;            // text the row's model wrote (the sample's row only)
  tf8::Gpt model{nullptr};       // the trained model, in the process that trained it
};

// A row as progress.json keeps it (a NaN is written as null and read back as NaN).
double number_or_nan(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : NAN;
}
void to_json(nlohmann::json& j, const RunResult& r) {
  nlohmann::json curve = nlohmann::json::array();
  for (const auto& p : r.curve) curve.push_back({p.step, p.train_loss, p.val_loss, p.val_loss_se});
  j = {{"steps", r.steps}, {"ms_per_step", r.ms_per_step}, {"tokens_per_s", r.tokens_per_s}, {"peak_mib", r.peak_mib},
       {"val_loss", r.val_loss}, {"val_loss_se", r.val_loss_se}, {"curve", curve}, {"sample", r.sample}};
}
RunResult row_from_json(const std::string& name, const nlohmann::json& j) {
  RunResult r;
  r.name = name;
  r.steps = j.value("steps", "eager");
  r.ms_per_step = number_or_nan(j, "ms_per_step");
  r.tokens_per_s = number_or_nan(j, "tokens_per_s");
  r.peak_mib = number_or_nan(j, "peak_mib");
  r.val_loss = number_or_nan(j, "val_loss");
  r.val_loss_se = number_or_nan(j, "val_loss_se");
  auto number_at = [](const nlohmann::json& point, size_t i) {  // a row of an older run has no standard error
    return point.size() > i && point.at(i).is_number() ? point.at(i).get<double>() : NAN;
  };
  for (const auto& p : j.value("curve", nlohmann::json::array()))
    r.curve.push_back({p.at(0).get<int64_t>(), number_at(p, 1), number_at(p, 2), number_at(p, 3)});
  r.sample = j.value("sample", "");
  return r;
}

// nanoGPT's optimizer: the fast path's (or torch's) over the matrices with
// train.optimizer.weight_decay, and a second group, the LayerNorms' weights, without it.
std::unique_ptr<torch::optim::Optimizer> gpt_optimizer(const std::vector<torch::Tensor>& parameters,
                                                       const amplab::TrainConfig& config) {
  auto [decayed, not_decayed] = tf8::split_for_weight_decay(parameters);
  std::unique_ptr<torch::optim::Optimizer> optimizer = amplab::make_fast_path_optimizer(decayed, config);
  if (not_decayed.empty()) return optimizer;
  std::unique_ptr<torch::optim::OptimizerOptions> options = optimizer->defaults().clone();
  if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(options.get())) adamw->weight_decay(0);
  if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(options.get())) adam->weight_decay(0);
  if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(options.get())) sgd->weight_decay(0);
  optimizer->add_param_group(torch::optim::OptimizerParamGroup(not_decayed, std::move(options)));
  return optimizer;
}

// The mean loss of s.eval_iters validation batches, in eval mode and under `precision`'s autocast,
// and its standard error (NaN for one batch).
std::pair<double, double> validation_loss(tf8::Gpt& model, const Setting& s, amplab::Precision precision,
                                          int64_t block_size) {
  torch::NoGradGuard no_grad;
  model->eval();
  amplab::AutocastGuard autocast(s.device, precision);
  std::vector<double> losses;
  for (int64_t i = 0; i < s.eval_iters; ++i) {
    auto [x, y] = s.data->batch(s.data->val, s.batch, block_size, s.device);
    losses.push_back(model->loss(x, y).item<double>());
  }
  model->train();
  const double n = static_cast<double>(losses.size()), mean = std::accumulate(losses.begin(), losses.end(), 0.0) / n;
  double squares = 0;
  for (double loss : losses) squares += (loss - mean) * (loss - mean);
  return {mean, losses.size() > 1 ? std::sqrt(squares / (n - 1) / n) : NAN};
}

// Trains one row from the seed: lab 2's training step (autocast, GradScaler) through the core's
// trainer, with nanoGPT's optimizer groups and learning-rate schedule. ms/step counts the steps
// after `warmup`, with the device synchronized around each; the evaluations (the mean loss of
// `eval_iters` validation batches, in eval mode and the row's autocast, with its standard error:
// how far two evaluations of the same model on other batches may lie apart) are left out of it,
// and each adds a point to the row's curve. A stop signal ends the row after the step in progress
// (Interrupted): a row is kept whole or not at all.
RunResult train_row(const Variant& v, const Setting& s) {
  RunResult r;
  r.name = v.name;
  tf8::GptOptions options = s.options;
  options.linear = v.linear;
  options.init_seed = s.seed;
  const amplab::TrainConfig train = s.train.for_row(v.precision, v.scaler ? "auto" : "off");
  tf8::Gpt model = r.model = tf8::make_gpt(options, train.fast_path && s.graph_steps, s.device);
  if (dynamic_cast<tf8::FusedGptImpl*>(model.get()))
    amplab::log::info(v.name + ": FusedGpt (each residual add, its dropout and the next LayerNorm one kernel of ours)");
  model->to(s.device);
  torch::manual_seed(s.seed);  // batches and dropout from here, as in the Python reference
  amplab::MemoryConfig untracked;
  untracked.track = false;
  amplab::Trainer trainer(model.ptr(), [model](const amplab::Batch& b) mutable { return model->loss(b.input, b.target); },
                          train, s.device, untracked, gpt_optimizer);
  // The fast path's CUDA graph, unless the layers keep host-side state a replay would freeze (the
  // delayed-scaling history's next slot is a host integer).
  const bool host_state = v.linear == tf8::LinearKind::fp8 && options.scaling == tf8::Fp8Scaling::delayed;
  amplab::FastPathSteps path;
  if (s.graph_steps && host_state) {
    amplab::log::info(v.name + ": eager steps (delayed scaling keeps its history's next slot on the host)");
  } else if (s.graph_steps) {
    path = amplab::fast_path_steps(trainer);
    amplab::log::info(v.name + ": " + path.description);
  }
  if (path.run_step) r.steps = "CUDA graph";
  amplab::reset_peak_memory(s.device);
  double timed_ms = 0;
  for (int64_t step = 1; step <= s.steps; ++step) {
    amplab::stop_if_interrupted();
    auto [x, y] = s.data->batch(s.data->train, s.batch, options.block_size, s.device);
    amplab::set_learning_rate(trainer.optimizer(), s.schedule.at(step - 1));
    amplab::synchronize(s.device);
    amplab::Stopwatch clock;
    amplab::ReadyBatch batch(amplab::Batch{x, y});
    torch::Tensor loss = (path.run_step ? path.run_step(batch, 0, 1) : trainer.step(batch.batch(0))).loss;
    amplab::synchronize(s.device);
    if (step > s.warmup) timed_ms += clock.milliseconds();
    if (step % s.eval_every != 0 && step != s.steps) continue;
    const double train_loss = loss.item<double>();
    std::tie(r.val_loss, r.val_loss_se) = validation_loss(model, s, v.precision, options.block_size);
    r.curve.push_back({step, train_loss, r.val_loss, r.val_loss_se});
    amplab::log::info(v.name + " step " + std::to_string(step) + ": train " + amplab::fixed(train_loss, 4) + ", val " +
                      amplab::fixed(r.val_loss, 4));
  }
  r.ms_per_step = timed_ms / static_cast<double>(s.steps - s.warmup);  // warmup < steps
  r.tokens_per_s = static_cast<double>(s.batch * options.block_size) / (r.ms_per_step / 1e3);
  r.peak_mib = static_cast<double>(amplab::read_memory(s.device).peak_allocated) / (1 << 20);
  return r;
}

// Why a row cannot run here ("" when it can).
std::string skip_reason(const Variant& v, const Setting& s) {
  std::string why;
  if (!amplab::is_supported(v.precision, s.device, &why)) return why;
  if (v.linear != tf8::LinearKind::fp8) return "";
  if (!s.device.is_cuda())
    return "FP8 matmuls: torch's CPU _scaled_mm is a reference kernel (about 1000x slower than fp32); needs an sm_89+ GPU";
  if (s.options.n_embd % 16 != 0 || (s.batch * s.options.block_size) % 16 != 0)
    return "FP8 on a GPU needs n_embd and batch x block_size multiples of 16";
  try {
    auto e4m3 = torch::ones({16, 16}, torch::TensorOptions().device(s.device)).to(torch::kFloat8_e4m3fn);
    auto one = torch::ones({}, torch::TensorOptions().device(s.device));
    at::_scaled_mm(e4m3, e4m3.t(), one, one, {}, {}, torch::kBFloat16);
  } catch (const std::exception&) {
    return "this GPU has no FP8 matmul (needs compute capability 8.9+: Ada, Hopper, Blackwell)";
  }
  return "";
}

// ---- The studies --------------------------------------------------------------------------------

// The precision study's setting, from the config; prints the model and records its figures.
Setting setting_of(Lab& lab, const tf8::CharData& data) {
  const GptConfig& g = lab.config.gpt;
  const StudyConfig& study = lab.config.study;
  const tf8::GptOptions o{.vocab_size = static_cast<int64_t>(data.vocab.size()), .block_size = g.block_size,
                          .n_layer = g.n_layer, .n_head = g.n_head, .n_embd = g.n_embd, .dropout = g.dropout,
                          .attention = tf8::attention_kind(g.attention), .scaling = tf8::fp8_scaling(g.fp8_scaling),
                          .amax_history = g.amax_history};
  const int64_t params = tf8::Gpt(o)->parameter_count(), tokens = g.batch * g.block_size;
  std::cout << o.n_layer << " layers, " << o.n_head << " heads, width " << o.n_embd << ", context " << o.block_size
            << ", batch " << g.batch << " (" << tokens << " tokens/step), " << amplab::fixed(params / 1e6, 2)
            << " M parameters, vocabulary " << o.vocab_size << ", " << data.train.numel() << " training characters; "
            << study.steps << " steps per row\n";
  if (lab.on_cpu())
    std::cout << "(CPU run: the config's cpu: sizes; skipped here: tf32, fp16, the fp8 row and the FP8 MLP and matmul"
                 " tables, which need an NVIDIA GPU.)\n";
  std::cout << std::flush;  // before the training logs (stderr)
  amplab::log::info(amplab::describe_fast_path(lab.config.train.fast_path, lab.config.train.optimizer));
  lab.results.set("device", amplab::describe(lab.device));
  lab.results.set("parameters", params);
  lab.results.set("tokens_per_step", tokens);
  lab.results.set("steps", study.steps);
  lab.results.set("fast_path", lab.config.train.fast_path);
  const tf8::LrSchedule schedule{.lr = lab.config.train.optimizer.lr, .min_lr = study.min_lr,
                                 .warmup_steps = study.lr_warmup_steps, .decay_steps = study.lr_decay_steps};
  return Setting{&data, o, g.batch, study.steps, study.eval_every, study.eval_iters, std::min(study.warmup, study.steps - 1),
                 lab.device, static_cast<uint64_t>(lab.config.run.seed), lab.config.train, schedule};
}

// The row whose model writes the sample: the first of bf16, fp32, fp8, tf32, fp16 that runs here.
std::string sample_row_of(const StudyConfig& study, const Setting& s) {
  if (study.sample_tokens <= 0) return "";
  for (const std::string name : {"bf16", "fp32", "fp8", "tf32", "fp16"})
    if (std::find(study.rows.begin(), study.rows.end(), name) != study.rows.end() && skip_reason(variant_of(name), s).empty())
      return name;
  return "";
}

// Text from a trained model, started from a newline (or the text's first character).
std::string sample_text(Lab& lab, tf8::Gpt& model, const tf8::CharData& data) {
  const bool has_newline = std::binary_search(data.vocab.begin(), data.vocab.end(), U'\n');
  torch::Tensor prompt = (has_newline ? data.encode("\n") : data.train.slice(0, 0, 1)).view({1, 1}).to(lab.device);
  return data.decode(tf8::generate(model, prompt, lab.config.study.sample_tokens, /*temperature=*/0.8, /*top_k=*/20));
}

// One row of the precision study: skipped, kept from the run --resume names, or trained now (and
// then recorded in progress.json).
RunResult study_row(Lab& lab, const Setting& s, const tf8::CharData& data, amplab::StudyProgress& progress,
                    const std::string& name, bool writes_sample) {
  RunResult r;
  r.name = name;
  r.skipped_because = skip_reason(variant_of(name), s);
  if (!r.skipped_because.empty()) return r;
  lab.phase(name);
  if (auto done = progress.done(name)) {
    amplab::log::info(name + ": finished by the run in " + progress.resumed_from() + ", kept");
    return row_from_json(name, *done);
  }
  amplab::log::info("training " + name);
  r = train_row(variant_of(name), s);
  if (writes_sample) r.sample = sample_text(lab, r.model, data);
  progress.record(name, r);
  return r;
}

// The precision table (ms/step, tokens/s, peak memory, last validation loss, speed-up against
// fp32) of the rows finished.
void record_precisions(Lab& lab, const Setting& s, const std::vector<RunResult>& rows) {
  double fp32_ms = NAN;
  for (const auto& r : rows)
    if (r.name == "fp32") fp32_ms = r.ms_per_step;
  auto& table = lab.results.table(
      "precision", {{"row", "row"}, {"steps", "steps"}, {"ms_per_step", "ms/step", amplab::decimals(lab.on_cpu() ? 1 : 2)},
                    {"tokens_per_s", "tokens/s", amplab::decimals(0)}, {"peak_mib", "peak MiB", amplab::decimals(0)},
                    {"val_loss", "val loss (last)", amplab::decimals(4)}, {"val_loss_se", "s.e.", amplab::decimals(4)},
                    {"speedup_vs_fp32", "speed-up vs fp32", amplab::times(2)}, {"skipped_because", ""}});
  std::string notes;
  for (const auto& r : rows) {
    const bool ran = r.skipped_because.empty();
    table.add({r.name, ran ? nlohmann::json(r.steps) : nlohmann::json(), r.ms_per_step, r.tokens_per_s, r.peak_mib, r.val_loss,
               r.val_loss_se, fp32_ms / r.ms_per_step,
               ran ? nlohmann::json() : nlohmann::json(r.skipped_because)});
    if (!ran) notes += "  " + r.name + ": skipped, " + r.skipped_because + "\n";
  }
  lab.results.print("precision",
                    "Precisions (" + std::to_string(s.steps) + " steps each, ms/step over the steps after the first " +
                        std::to_string(s.warmup) + "; val loss over " + std::to_string(s.eval_iters) +
                        " batches, s.e. its standard error)",
                    notes + (lab.on_cpu() ? "peak MiB: the process's RSS high-water mark (on the CPU it only grows from row to row)\n"
                                          : "peak MiB: the most bytes tensors held during the row (CUDA caching allocator)\n"));
}

// Trains each row of study.rows (or keeps it from the run --resume names): every evaluation into
// the losses table, and the precision table, also of the rows finished before a Ctrl-C.
std::vector<RunResult> precision_study(Lab& lab, const Setting& s, const tf8::CharData& data, amplab::StudyProgress& progress) {
  std::vector<RunResult> rows;
  auto& losses = lab.results.table("losses", {{"row", ""}, {"step", ""}, {"train_loss", ""}, {"val_loss", ""}, {"val_loss_se", ""}});
  const std::string sample_row = sample_row_of(lab.config.study, s);
  amplab::run_then_record(
      [&] {
        for (const auto& name : lab.config.study.rows) {
          rows.push_back(study_row(lab, s, data, progress, name, name == sample_row));
          for (const auto& p : rows.back().curve) losses.add({name, p.step, p.train_loss, p.val_loss, p.val_loss_se});
        }
      },
      [&] { record_precisions(lab, s, rows); });
  return rows;
}

// math (yours), safe (yours) and torch's SDPA inside the same GPT: ms/step and peak memory (the
// math paths hold the (B, H, T, T) scores and weights; SDPA's fused kernels never write them).
void attention_study(Lab& lab, Setting s) {
  const Variant v = variant_of(lab.on_cpu() ? "fp32" : "bf16");
  s.steps = s.eval_every = lab.config.study.attention_steps;
  s.warmup = std::min<int64_t>(lab.config.study.warmup, s.steps / 2);
  s.graph_steps = false;  // eager, all three: your attention may not be capturable, and the kernels compare as they run
  auto& table = lab.results.table(
      "attention", {{"attention", "attention"}, {"precision", "precision"}, {"ms_per_step", "ms/step", amplab::decimals(2)},
                    {"tokens_per_s", "tokens/s", amplab::decimals(0)}, {"peak_mib", "peak MiB", amplab::decimals(0)},
                    {"val_loss", "val loss", amplab::decimals(4)}});
  for (const std::string kind : {"math", "safe", "sdpa"}) {
    lab.phase("attention " + kind);
    s.options.attention = tf8::attention_kind(kind);
    RunResult r = train_row(v, s);
    table.add({kind, v.name, r.ms_per_step, r.tokens_per_s, r.peak_mib, r.val_loss});
  }
  lab.results.print("attention", "Attention: your math path, your fp16-safe path, torch's SDPA (" + v.name + ", " +
                                     std::to_string(s.steps) + " steps)");
}

// sample.txt: the text the sample's row wrote (sample_row_of).
void write_sample(Lab& lab, const std::vector<RunResult>& rows) {
  for (const RunResult& r : rows) {
    if (r.sample.empty()) continue;
    std::cout << "\n== A sample from the " << r.name << " model (" << lab.config.study.sample_tokens
              << " characters, temperature 0.8) ==\n" << r.sample << "\n";
    if (lab.run.enabled()) amplab::write_file_atomic(lab.run.file("sample.txt"), r.sample + "\n");
    lab.results.set("sample", {{"row", r.name}, {"text", r.sample}});
    return;
  }
}

// With train.fast_path, the FP8 MLP table has a row of the fast path's FP8 MLP beside your
// fp8_linear's: delayed scaling whose amaxes come out of the casts, each cast one kernel that also
// writes the transpose, the ReLU and its backward folded into the casts (amplab/fast/fused_fp8_mlp.hpp).
tf8::OtherMlpRow fast_fp8_mlp_row() {
  return {"fp8 (fast path: delayed, fused casts)", [] {
            auto mlp = std::make_shared<amplab::Fp8ReluMlp>(/*history=*/16);
            return [mlp](const torch::Tensor& x, const std::vector<torch::Tensor>& weights) { return mlp->forward(x, weights); };
          }};
}

// The learning rate follows study.lr_* (nanoGPT's schedule); the core's schedule keys would be ignored.
void check_schedule(const LabConfig& config) {
  const amplab::OptimizerConfig& o = config.train.optimizer;
  if (o.schedule != "constant" || o.warmup != 0)
    throw amplab::Error("train.optimizer.schedule/warmup: this lab follows nanoGPT's schedule; set study.lr_warmup_steps, "
                        "study.lr_decay_steps and study.min_lr instead");
  if (config.study.lr_decay_steps <= config.study.lr_warmup_steps)
    throw amplab::Error("study.lr_decay_steps (" + std::to_string(config.study.lr_decay_steps) +
                        ") must be larger than study.lr_warmup_steps (" + std::to_string(config.study.lr_warmup_steps) + ")");
  if (config.study.min_lr > o.lr)
    throw amplab::Error("study.min_lr (" + std::to_string(config.study.min_lr) + ") must not exceed train.optimizer.lr (" +
                        std::to_string(o.lr) + ")");
}

// Keys an interrupted run may change before --resume: where it writes, what it logs, and which
// rows and sections it runs; every other key changes what a row measures.
const std::vector<std::string> kKeysFreeOnResume = {"run.out_dir", "run.log_level", "run.gpu_monitor", "run.memory_snapshot",
                                                    "run.trace", "study.rows", "study.plots", "study.attention_study",
                                                    "study.fp8_mlp"};

}  // namespace

int main(int argc, char** argv) {
  const amplab::LabInfo info{.name = amplab::this_lab::kName,
                             .title = amplab::this_lab::kTitle,
                             .accepts_resume = true,
                             .size_keys = "gpt.batch, gpt.block_size, gpt.n_embd or gpt.n_layer",
                             .resume_help = "go on with an interrupted run: its run directory, or 'latest' (the newest "
                                            "under run.out_dir); the precision rows it finished are kept, the others run"};
  auto check = [](const LabConfig& config, const amplab::ConfigSource&) -> std::optional<int> {
    check_schedule(config);
    // Before the run directory: a missing, empty, binary or too short text is one line.
    tf8::CharData::load(config.data.dir).require_context(config.gpt.block_size, "gpt.block_size");
    return std::nullopt;
  };
  return amplab::lab_main<LabConfig>(argc, argv, info, check, [](Lab& lab) {
    const tf8::CharData data = tf8::CharData::load(lab.config.data.dir);
    amplab::StudyProgress progress(lab.run, lab.config.run, amplab::to_yaml(lab.config), lab.cli.resume, lab.cli.force,
                                   kKeysFreeOnResume);
    lab.how_to_go_on = "go on with --resume " + lab.run.path() + " (the precision rows that finished are kept)";
    const Setting s = setting_of(lab, data);
    const std::vector<RunResult> rows = precision_study(lab, s, data, progress);
    if (lab.config.study.attention_study) attention_study(lab, s);
    if (lab.config.study.fp8_mlp && skip_reason(variant_of("fp8"), s).empty())
      tf8::fp8_tables(lab.results, lab.device, [&lab](const std::string& name) { lab.phase(name); },
                      lab.config.train.fast_path ? fast_fp8_mlp_row() : tf8::OtherMlpRow{});
    write_sample(lab, rows);
    lab.draw_plots = lab.config.study.plots;
    return amplab::kExitOk;
  });
}
