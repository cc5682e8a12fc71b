// Lab 4, MNIST end to end: the same network trained on the CPU, on the GPU in fp32, and on the
// GPU with mixed precision; time per epoch, throughput, GPU utilization, memory and accuracy side
// by side, and where a step's time goes.
//   build/bin/mnist [--config configs/mnist.yaml] [--set key=value ...] [--resume PATH|latest|auto]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>

#include "amplab/data/mnist.hpp"
#include "amplab/fast/fast_path.hpp"
#include "amplab/infra/config_json.hpp"
#include "amplab/infra/device.hpp"
#include "amplab/infra/log.hpp"
#include "amplab/lab_main.hpp"
#include "amplab/measure/timing.hpp"
#include "amplab/report/table.hpp"
#include "amplab/train/checkpointer.hpp"
#include "amplab/train/loop.hpp"
#include "step_profile.hpp"
#include "config.hpp"
#include "lab_identity.hpp"  // this_lab: labs/<lab>/lab.yaml
#include "mnist.hpp"
#include "prefetch.hpp"
#include "weights.hpp"

namespace mnist {  // a mode's result in summary.json and in a checkpoint (the modes finished before it)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(MemoryUse, forward_mib, backward_mib, optimizer_mib, peak_mib, source)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ModeResult, mode, ran, skipped_because, epoch_seconds, train_loss, test_accuracy,
                                   seconds_per_epoch, samples_per_second, speedup_vs_cpu, memory)
}  // namespace mnist

namespace {

using mnist::MnistConfig;
using mnist::load_init_weights;
using mnist::save_weights;
using Lab = amplab::Lab<MnistConfig>;

// A run that stopped early (Ctrl-C, divergence, out of memory): ends the benchmark.
struct StopRun {
  int exit_code;
  std::string message;
};

// What the modes decide, refused before a run directory is made.
std::optional<int> check_config(const MnistConfig& config, const amplab::ConfigSource& source) {
  if (source.has("train.precision"))
    throw amplab::Error(source.where("train.precision") + ": train.precision is set by the mode in this lab (gpu: fp32, "
                        "gpu-amp: mnist.amp_precisions); remove it and choose with mnist.modes and mnist.amp_precisions");
  amplab::check_fast_path(config.train.fast_path, config.train.optimizer);  // before the cpu mode trains
  if (config.mnist.modes.empty())
    throw amplab::Error("mnist.modes is empty: list at least one of cpu, gpu, gpu-amp (e.g. --set mnist.modes=[cpu])");
  const bool amp = std::ranges::find(config.mnist.modes, "gpu-amp") != config.mnist.modes.end();
  if (amp && config.mnist.amp_precisions.empty())
    throw amplab::Error("mnist.amp_precisions is empty but mnist.modes has gpu-amp: list fp16-mixed and/or bf16-mixed");
  // The modes' precisions, checked once here under their key: train_config_for and the Trainer
  // then never meet one this GPU cannot run (without a GPU the gpu-amp modes are skipped).
  for (const auto& name : amp && amplab::cuda_available() ? config.mnist.amp_precisions : std::vector<std::string>{})
    if (std::string why; !amplab::is_supported(amplab::enum_from_string<amplab::Precision>(name, "mnist.amp_precisions"),
                                               torch::kCUDA, &why))
      throw amplab::Error(source.where("mnist.amp_precisions") + ": mnist.amp_precisions: " + why);
  if (!config.mnist.init_weights.empty()) {
    mnist::Net probe;  // the file against the network
    load_init_weights(probe, config.mnist.init_weights);
  }
  return std::nullopt;
}

// Trains the modes one after the other, each resumable, and keeps what each measured.
class ModeRunner {
 public:
  ModeRunner(Lab& lab, const amplab::MnistData& data)
      : lab_(lab), data_(data), config_(lab.config), config_yaml_(amplab::to_yaml(lab.config)) {
    // The cpu mode trains with the config's cpu: values (fewer epochs: a CPU epoch takes minutes).
    lab.source.with_overlay("cpu").bind(cpu_config_);
    resume_ = amplab::find_resume_point(lab.cli.resume, lab.fit_options("").checkpoint->dir, &lab.run, lab.name);
  }

  // The modes run in order; on --resume, the checkpoint names its mode and carries the finished ones.
  void check_resume(const std::vector<mnist::Mode>& modes) {
    if (resume_.path.empty()) return;
    resume_mode_ = resume_.info.tag;
    bool known = false;
    for (const auto& m : modes) known |= m.label() == resume_mode_;
    if (!known)
      throw amplab::Error("--resume: checkpoint '" + resume_.path + "' is from mode '" + resume_mode_ +
                          "', which mnist.modes does not include");
    if (!resume_.info.extra_json.empty())
      for (const auto& j : nlohmann::json::parse(resume_.info.extra_json)) finished_.push_back(j.get<mnist::ModeResult>());
  }

  mnist::ModeResult run(const mnist::Mode& mode);
  const std::map<std::string, std::vector<mnist::PhaseTiming>>& profiles() const { return profiles_; }
  const std::map<std::string, int>& profile_counts() const { return profile_counts_; }
  const std::string& config_yaml() const { return config_yaml_; }

 private:
  amplab::FitOptions fit_options(const mnist::Mode& mode, bool resuming) const;
  mnist::ModeResult results_of(const amplab::FitResult& fit, const mnist::Mode& mode, mnist::Net& net,
                               const mnist::ResidentSplit& test, amplab::Trainer& trainer) const;
  void profile(const mnist::Mode& mode, amplab::Trainer& trainer, amplab::BatchSource& batches, double seconds_per_epoch,
               bool graphed);

  Lab& lab_;
  const amplab::MnistData& data_;
  const MnistConfig& config_;
  const std::string config_yaml_;  // every mode's checkpoints record the run's config
  MnistConfig cpu_config_;
  amplab::ResumePoint resume_;
  std::string resume_mode_;
  std::vector<mnist::ModeResult> finished_;
  std::map<std::string, std::vector<mnist::PhaseTiming>> profiles_;  // per mode label
  std::map<std::string, int> profile_counts_;              // the steps each mode's profile took
};

amplab::FitOptions ModeRunner::fit_options(const mnist::Mode& mode, bool resuming) const {
  amplab::FitOptions options = lab_.fit_options(mode.label());
  options.resume = resuming ? resume_.path : "";  // the one mode --resume names goes on; the others start
  options.epochs_key = "train.epochs";  // the cpu mode's value comes from the cpu: section or --set
  nlohmann::json done = nlohmann::json::array();
  for (const auto& r : finished_) done.push_back(r);
  options.checkpoint_extra = done.dump();
  return options;
}

mnist::ModeResult ModeRunner::run(const mnist::Mode& mode) {
  for (const auto& done : finished_)
    if (done.mode == mode.label()) return done;  // finished before the interruption
  const bool resuming = !resume_mode_.empty();
  if (resuming && mode.label() != resume_mode_) throw amplab::Error("internal: modes out of order on resume");
  resume_mode_.clear();

  const torch::Device device = mnist::device_for(mode);
  const amplab::TrainConfig train_config = mnist::train_config_for(mode, mode.needs_gpu() ? config_.train : cpu_config_.train);
  amplab::log::info("== " + mode.label() + " on " + amplab::describe(device) + ", " + std::to_string(train_config.epochs) +
                    " epoch(s) ==");
  lab_.phase(mode.label());
  torch::manual_seed(static_cast<uint64_t>(config_.run.seed));  // the same initial weights in every mode
  mnist::Net net = amplab::make_mnist_net(train_config);        // the fused network with train.fast_path
  mnist::place_model(net, device);
  const bool channels_last = config_.mnist.channels_last && device.is_cuda();
  if (channels_last) amplab::to_channels_last(*net);
  mnist::ResidentSplit train = mnist::make_resident(data_.train, device, channels_last);
  mnist::ResidentSplit test = mnist::make_resident(data_.test, device, channels_last);
  if (!config_.mnist.init_weights.empty() && !resuming) load_init_weights(net, config_.mnist.init_weights);

  amplab::Trainer trainer(net.ptr(), [&](const amplab::Batch& b) { return mnist::nll_loss(net, b); }, train_config, device, config_.memory, amplab::make_fast_path_optimizer);
  const std::unique_ptr<amplab::BatchSource> batches = mnist::make_train_batches(
      config_.mnist.loader, data_.train, train.images, train.labels,
      amplab::EpochSampler(train.size(), train_config.batch_size, static_cast<uint64_t>(config_.run.seed), true,
                           train_config.drop_last),
      device, channels_last);
  amplab::FitOptions options = fit_options(mode, resuming);
  options.evaluate = [&](int64_t) {
    auto e = mnist::evaluate(net, test, config_.mnist.eval_batch_size, train_config.precision);
    return nlohmann::json{{"test_loss", e.loss}, {"test_accuracy", e.accuracy}};
  };
  const amplab::FastPathSteps fast = amplab::fast_path_steps(trainer);
  amplab::log::info("[" + mode.label() + "] " + fast.description);
  options.run_step = fast.run_step;
  const amplab::FitResult fit = amplab::fit(trainer, *batches, options);
  if (fit.status != amplab::FitStatus::completed) throw StopRun{fit.exit_code, fit.message};

  mnist::ModeResult result = results_of(fit, mode, net, test, trainer);
  if (config_.mnist.profile_steps > 0 && !fit.already_finished)
    profile(mode, trainer, *batches, result.seconds_per_epoch, static_cast<bool>(fast.run_step));
  finished_.push_back(result);
  return result;
}

mnist::ModeResult ModeRunner::results_of(const amplab::FitResult& fit, const mnist::Mode& mode, mnist::Net& net,
                                         const mnist::ResidentSplit& test, amplab::Trainer& trainer) const {
  if (fit.epochs.empty()) throw StopRun{amplab::kExitFailure, mode.label() + ": training ran no epoch"};
  mnist::ModeResult result;
  result.mode = mode.label();
  result.ran = true;
  for (const auto& epoch : fit.epochs) {
    result.epoch_seconds.push_back(epoch.seconds);
    result.train_loss.push_back(epoch.train_loss);
    result.test_accuracy.push_back(epoch.eval.value("test_accuracy", 0.0));
  }
  result.seconds_per_epoch = fit.epochs.back().seconds;
  result.samples_per_second = fit.epochs.back().samples_per_second;
  // A run resumed at its end trained nothing here: its memory was measured by the run that trained it.
  if (!fit.already_finished) result.memory = mnist::memory_use(trainer.memory());
  else result.memory.source = "-";
  const std::string weights = save_weights(net, result, config_.data.dataset, test.size(), lab_.run);
  const int64_t correct = std::llround(result.test_accuracy.back() * static_cast<double>(test.size()));
  amplab::log::info("[" + mode.label() + "] weights: " + weights + " (safetensors; test accuracy " +
                    amplab::fixed(result.test_accuracy.back(), 4) + " = " + std::to_string(correct) + "/" +
                    std::to_string(test.size()) + "; in Python: bench/eval_safetensors.py " + weights + ")");
  return result;
}

void ModeRunner::profile(const mnist::Mode& mode, amplab::Trainer& trainer, amplab::BatchSource& batches,
                         double seconds_per_epoch, bool graphed) {
  // A CPU step is slow, and steady: a few tell.
  const int steps = trainer.device().is_cuda() ? config_.mnist.profile_steps : std::min(config_.mnist.profile_steps, 3);
  profile_counts_[mode.label()] = steps;
  amplab::log::info("[" + mode.label() + "] profile: " + std::to_string(steps) + " steps phase by phase, then back to back");
  lab_.phase("profile " + mode.label());
  auto rows = mnist::profile_step(trainer, batches, steps);
  const double epoch_step_ms = seconds_per_epoch * 1000.0 / static_cast<double>(batches.batches_per_epoch());
  rows.push_back({"the epoch's step (" + std::string(graphed ? "CUDA graph" : "eager") + ")", epoch_step_ms, epoch_step_ms});
  profiles_[mode.label()] = rows;
}

// The modes' table (with each mode's GPU utilization while it trained) and summary.json's modes.
void record_modes(Lab& lab, const std::vector<mnist::ModeResult>& results, const std::vector<mnist::Mode>& modes) {
  using amplab::decimals;
  auto& table = lab.results.table(
      "results", {{"mode", "mode", decimals(0)}, {"seconds_per_epoch", "s/epoch", decimals(3)},
                  {"samples_per_second", "samples/s", decimals(0)}, {"speedup_vs_cpu", "vs cpu", amplab::times(1)},
                  {"sm_util_mean_pct", "GPU util %", decimals(0)}, {"power_mean_w", "GPU W", decimals(0)},
                  {"peak_mib", "peak MiB", decimals(1)}, {"memory_source", "memory", decimals(0)},
                  {"train_loss", "train loss", decimals(4)}, {"test_accuracy", "test acc", decimals(4)},
                  {"skipped_because", ""}});
  nlohmann::json summary_modes = nlohmann::json::array();
  for (const auto& r : results) {
    summary_modes.push_back(r);
    for (const auto& m : modes)  // the path the mode ran: train_config_for sets it per mode
      if (r.ran && m.label() == r.mode) summary_modes.back()["fast_path"] = mnist::train_config_for(m, lab.config.train).fast_path;
    if (!r.ran) {
      table.add({r.mode, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, "skipped", nullptr, nullptr, r.skipped_because});
      continue;
    }
    std::optional<amplab::GpuPhaseStats> gpu;
    if (lab.gpu_timeline) gpu = lab.gpu_timeline->phase_stats(r.mode);
    table.add({r.mode, r.seconds_per_epoch, r.samples_per_second, r.speedup_vs_cpu > 0 ? nlohmann::json(r.speedup_vs_cpu) : nullptr,
               gpu ? nlohmann::json(gpu->sm_util_mean_pct) : nullptr, gpu ? nlohmann::json(gpu->power_mean_w) : nullptr,
               r.memory.peak_mib, r.memory.source, r.train_loss.back(), r.test_accuracy.back(), ""});
  }
  std::string skipped;
  for (const auto& r : results)
    if (!r.ran) skipped += "  " + r.mode + ": skipped, " + r.skipped_because + "\n";
  lab.results.print("results", "Modes (GPU util: NVML's, while the mode trained)", skipped);
  lab.results.set("modes", summary_modes);
}

// The per-phase profile of each mode that took one.
void record_profiles(Lab& lab, const std::vector<mnist::ModeResult>& results, const ModeRunner& runner) {
  if (runner.profiles().empty()) return;
  using amplab::decimals;
  auto& table = lab.results.table("phases", {{"mode", "mode", decimals(0)}, {"phase", "phase", decimals(0)},
                                             {"host_ms", "host ms", decimals(3)}, {"device_ms", "device ms", decimals(3)},
                                             {"share", "share of the phases", amplab::percent_of_one(0)}});
  for (const auto& r : results) {
    auto found = runner.profiles().find(r.mode);
    if (found == runner.profiles().end()) continue;
    double total = 0;
    for (const auto& row : found->second)
      if (row.phase == "sum of the phases") total = row.device_ms;
    for (const auto& row : found->second) {
      const bool phase = row.phase == "data" || row.phase == "forward" || row.phase == "backward" || row.phase == "optimizer";
      table.add({r.mode, row.phase, row.host_ms, row.device_ms,
                 phase && total > 0 ? nlohmann::json(row.device_ms / total) : nullptr});
    }
  }
  std::string counts;  // the sample behind each mode's medians, as taken
  for (const auto& [mode, steps] : runner.profile_counts()) counts += (counts.empty() ? "" : ", ") + mode + " " + std::to_string(steps);
  lab.results.print("phases", "Where a step's time goes (steps per mode: " + counts +
                                  "; medians; each phase alone between two synchronizations; host: the CPU issuing it, "
                                  "device: until its last kernel ended)");
}

int run_lab(Lab& lab) {
  const MnistConfig& config = lab.config;
  lab.how_to_go_on = "go on with --resume latest (the modes that finished are kept)";
  const amplab::MnistData data = amplab::load_mnist(config.data);
  amplab::log::info(config.data.dataset + " from " + data.dir + ": " + std::to_string(data.train.size()) + " training, " +
                    std::to_string(data.test.size()) + " test images");
  const auto modes = mnist::expand_modes(config.mnist.modes, config.mnist.amp_precisions);
  ModeRunner runner(lab, data);
  runner.check_resume(modes);
  std::vector<mnist::ModeResult> results;
  try {
    results = mnist::run_benchmark(modes, amplab::cuda_available(),
                                   [&](const mnist::Mode& mode) { return runner.run(mode); });
  } catch (const StopRun& stop) {
    amplab::log::error_to_file(stop.message);  // the console gets it once, below
    std::cerr << (stop.exit_code == amplab::kExitFailure ? "error: " : "") << stop.message << "\n";
    return stop.exit_code;
  }
  lab.phase("");
  record_modes(lab, results, modes);
  record_profiles(lab, results, runner);
  lab.results.set("dataset", config.data.dataset);
  lab.results.set("batch_size", config.train.batch_size);
  lab.results.set("fast_path", config.train.fast_path);  // the key; each mode's entry says the path it ran
  lab.results.set("config", amplab::config_yaml_to_json(runner.config_yaml()));
  lab.draw_plots = config.mnist.plots;
  return amplab::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  return amplab::lab_main<MnistConfig>(
      argc, argv,
      {amplab::this_lab::kName, amplab::this_lab::kTitle, /*accepts_resume=*/true,
       "train.batch_size, mnist.eval_batch_size, data.train_limit"},
      check_config, run_lab);
}
