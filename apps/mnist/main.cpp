// Lab 4, MNIST end to end: the same network trained on the CPU, on the GPU in fp32, and on the
// GPU with mixed precision; time per epoch, throughput, memory and accuracy side by side.
//   build/bin/mnist [--config configs/mnist.yaml] [--set key=value ...] [--resume PATH|latest]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>

#include "amplab/infra/app.hpp"
#include "amplab/state/checkpoint.hpp"
#include "amplab/infra/config_json.hpp"
#include "amplab/data/mnist.hpp"
#include "amplab/fast/fast_path.hpp"
#include "amplab/infra/device.hpp"
#include "amplab/infra/log.hpp"
#include "amplab/train/checkpointer.hpp"
#include "amplab/train/loop.hpp"
#include "amplab/train/precision.hpp"
#include "amplab/report/plots.hpp"
#include "amplab/report/report.hpp"
#include "amplab/report/run_dir.hpp"
#include "amplab/state/safetensors.hpp"
#include "amplab/infra/signals.hpp"
#include "amplab/report/table.hpp"
#include "amplab/measure/timing.hpp"
#include "mechanisms.hpp"
#include "mnist.hpp"

namespace {

struct MnistLabConfig {
  std::vector<std::string> modes = {"cpu", "gpu", "gpu-amp"};  // what to compare, in order
  std::vector<std::string> amp_precisions = {"fp16-mixed", "bf16-mixed"};  // one gpu-amp run each
  int cpu_epochs = 1;             // epochs of the cpu mode (a CPU epoch takes a minute or more)
  bool channels_last = true;      // GPU modes: NHWC images and activations (faster convolutions)
  int64_t eval_batch_size = 1000; // test-set batches
  bool plots = true;              // write PNG plots (needs matplotlib)
  int profile_steps = 30;         // steps of the per-phase profile after training (0: none)
  std::string init_weights = "";  // a safetensors file to start every mode from ("": the seed's weights)

  template <class V>
  void fields(V& v) {
    v.field("modes", modes, "modes to run, in order", {"cpu", "gpu", "gpu-amp"});
    v.field("amp_precisions", amp_precisions, "precisions of the gpu-amp mode", {"fp16-mixed", "bf16-mixed"});
    v.field("cpu_epochs", cpu_epochs, "epochs of the cpu mode", amplab::Range<int64_t>::at_least(1));
    v.field("channels_last", channels_last, "GPU modes: channels-last memory format");
    v.field("eval_batch_size", eval_batch_size, "test-set batch size", amplab::Range<int64_t>::at_least(1));
    v.field("plots", plots, "write PNG plots into the run directory (needs matplotlib)");
    v.field("profile_steps", profile_steps, "steps of the per-phase profile after each mode's training (0: none)",
            amplab::Range<int64_t>::between(0, 10000));
    v.field("init_weights", init_weights,
            "safetensors file to start every mode from, e.g. a model-*.safetensors or one Python wrote (empty: the seed's weights)",
            amplab::check_path_value);
  }
};

struct MnistConfig {
  amplab::RunConfig run;
  amplab::DataConfig data;
  amplab::TrainConfig train;
  amplab::CheckpointConfig checkpoint;
  amplab::MemoryConfig memory;
  MnistLabConfig mnist;
  template <class V>
  void fields(V& v) {
    v.section("run", run);
    v.section("data", data);
    v.section("train", train);
    v.section("checkpoint", checkpoint);
    v.section("memory", memory);
    v.section("mnist", mnist);
  }
};

// A run that stopped early (Ctrl-C, divergence, out of memory): ends the benchmark.
struct StopRun {
  int exit_code;
  std::string message;
};

nlohmann::json to_json(const mnist::ModeResult& r) {
  return {{"mode", r.mode},
          {"ran", r.ran},
          {"skipped_because", r.skipped_because},
          {"epoch_seconds", r.epoch_seconds},
          {"train_loss", r.train_loss},
          {"test_accuracy", r.test_accuracy},
          {"seconds_per_epoch", r.seconds_per_epoch},
          {"samples_per_second", r.samples_per_second},
          {"speedup_vs_cpu", r.speedup_vs_cpu},
          {"memory", {{"forward_mib", r.memory.forward_mib}, {"backward_mib", r.memory.backward_mib},
                      {"optimizer_mib", r.memory.optimizer_mib}, {"peak_mib", r.memory.peak_mib},
                      {"source", r.memory.source}}}};
}

mnist::ModeResult from_json(const nlohmann::json& j) {
  mnist::ModeResult r;
  r.mode = j.at("mode");
  r.ran = j.at("ran");
  r.skipped_because = j.at("skipped_because");
  r.epoch_seconds = j.at("epoch_seconds").get<std::vector<double>>();
  r.train_loss = j.at("train_loss").get<std::vector<double>>();
  r.test_accuracy = j.at("test_accuracy").get<std::vector<double>>();
  r.seconds_per_epoch = j.at("seconds_per_epoch");
  r.samples_per_second = j.at("samples_per_second");
  const auto& m = j.at("memory");
  r.memory = {m.at("forward_mib"), m.at("backward_mib"), m.at("optimizer_mib"), m.at("peak_mib"), m.at("source")};
  return r;
}

// Where a step's time goes. The step is taken apart into its phases (getting the batch, forward,
// backward, the optimizer: the lab's own mechanisms, called one phase at a time), and each phase
// runs alone between two synchronizations, `steps` times (medians). host ms: the CPU issuing the
// phase (launching its kernels on a GPU; doing all of it on the CPU). device ms: from the phase's
// start to the end of its last kernel (CUDA events; on the CPU the same as host). A GPU phase
// whose device time is hardly more than its host time is launch-bound: the GPU waited for the
// CPU to hand it work. Then the whole step, eager and back to back (host launches overlap the GPU's
// work), against the sum of the phases; the epoch's own step (one CUDA graph replay in the GPU
// modes) is its seconds per epoch over its steps. Runs after the results are taken and the last
// checkpoint is written: its steps change the weights of nothing that is reported.
struct PhaseRow {
  std::string phase;
  double host_ms = 0;
  double device_ms = 0;
};

// The steps the profile takes on `device`: a CPU step is slow, and steady, so a few tell.
int profiled_steps(const torch::Device& device, int requested) { return device.is_cuda() ? requested : std::min(requested, 3); }

std::vector<PhaseRow> profile_step(amplab::Trainer& trainer, amplab::BatchSource& batches, int requested) {
  const torch::Device device = trainer.device();
  const int steps = profiled_steps(device, requested);
  const amplab::StepMechanisms mechanisms = amplab::course_mechanisms();
  std::map<std::string, std::vector<double>> host, dev;
  const std::vector<std::string> order = {"data", "forward", "backward", "optimizer"};
  auto timed = [&](const std::string& phase, const std::function<void()>& work) {
    amplab::synchronize(device);
    amplab::DeviceTimer timer(device);
    const auto start = std::chrono::steady_clock::now();
    timer.start();
    work();
    host[phase].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    dev[phase].push_back(timer.stop_ms());
  };
  const int64_t n = batches.batches_per_epoch();
  for (int i = 0; i < steps + 3; ++i) {  // 3 untimed
    trainer.optimizer().zero_grad();
    amplab::Batch batch;
    torch::Tensor loss;
    timed("data", [&] { batch = batches.batch(i % n); });
    timed("forward", [&] {
      amplab::AutocastGuard autocast(device, trainer.precision());
      loss = trainer.forward_loss(batch);
    });
    timed("backward", [&] { trainer.scaler().scale(loss).backward(); });
    timed("optimizer", [&] { mechanisms.optimizer_step(trainer); });
    if (i < 3)
      for (const auto& phase : order) host[phase].clear(), dev[phase].clear();
  }
  std::vector<PhaseRow> rows;
  PhaseRow sum{"sum of the phases"};
  for (const auto& phase : order) {
    rows.push_back({phase, amplab::summarize(host[phase]).median, amplab::summarize(dev[phase]).median});
    sum.host_ms += rows.back().host_ms;
    sum.device_ms += rows.back().device_ms;
  }
  rows.push_back(sum);
  // The same steps queued back to back, as the eager loop runs them.
  int64_t next = 0;
  auto ms = amplab::time_back_to_back([&] { trainer.step(batches.batch(next++ % n)); }, device, steps,
                                      device.is_cuda() ? 3 : 1);
  const double eager = amplab::summarize(ms).median;
  rows.push_back({"eager step, back to back", eager, eager});
  return rows;
}

// mnist.init_weights into `net` (on any device), or an amplab::Error of one line naming the key,
// the file and what does not fit. Called once before the run starts (a bad file is a config
// error: no run directory is made) and again for each mode.
void load_init_weights(mnist::Net& net, const std::string& path) {
  try {
    amplab::load_module_safetensors(*net, path);
  } catch (const amplab::IoError&) {
    throw;
  } catch (const amplab::Error& e) {
    throw amplab::Error(std::string("mnist.init_weights: ") + e.what());
  }
}

// The trained weights as model-<mode>.safetensors in the run directory, under the names
// pytorch/examples' Net has in Python (bench/eval_safetensors.py evaluates them there), with the
// accuracy this run measured in the metadata. Returns the path.
std::string save_weights(mnist::Net& net, const mnist::ModeResult& result, const std::string& dataset, int64_t test_images,
                         amplab::RunDir& run) {
  const std::string path = run.file("model-" + amplab::file_name_safe(result.mode) + ".safetensors");
  char accuracy[32];
  std::snprintf(accuracy, sizeof accuracy, "%.17g", result.test_accuracy.back());
  amplab::save_module_safetensors(*net, path,
                                  {{"format", "pt"},  // what Hugging Face's tools look for in a PyTorch state dict
                                   {"lab", "mnist"},
                                   {"mode", result.mode},
                                   {"dataset", dataset},
                                   {"epochs", std::to_string(result.test_accuracy.size())},
                                   {"test_accuracy", accuracy},
                                   {"test_images", std::to_string(test_images)}});
  return path;
}

}  // namespace

int main(int argc, char** argv) {
  return amplab::guarded_main([&]() -> int {
    MnistConfig config, defaults;
    amplab::CommandLine cli;
    if (auto code = amplab::parse_command_line(argc, argv, "mnist", "Lab 4: MNIST end to end, CPU vs GPU vs GPU+AMP",
                                               amplab::describe_keys(defaults), cli))
      return *code;
    amplab::load_lab_config(cli, config);
    amplab::check_fast_path(config.train.fast_path, config.train.optimizer);  // before the cpu mode trains
    if (config.mnist.modes.empty())
      throw amplab::Error("mnist.modes is empty: list at least one of cpu, gpu, gpu-amp (e.g. --set mnist.modes=[cpu])");
    if (std::find(config.mnist.modes.begin(), config.mnist.modes.end(), "gpu-amp") != config.mnist.modes.end() &&
        config.mnist.amp_precisions.empty())
      throw amplab::Error("mnist.amp_precisions is empty but mnist.modes has gpu-amp: list fp16-mixed and/or bf16-mixed");
    if (!config.mnist.init_weights.empty()) {
      mnist::Net probe;  // the file against the network, before a run directory is made for it
      load_init_weights(probe, config.mnist.init_weights);
    }
    const std::string config_yaml = amplab::to_yaml(config);
    amplab::RunDir run = amplab::RunDir::create(config.run, "mnist", config_yaml);
    amplab::apply_run_settings(config.run);
    amplab::InterruptHandler interrupts;

    amplab::MnistData data = amplab::load_mnist(config.data);
    amplab::log::info(config.data.dataset + " from " + data.dir + ": " + std::to_string(data.train.size()) + " training, " +
                      std::to_string(data.test.size()) + " test images");
    auto modes = mnist::expand_modes(config.mnist.modes, config.mnist.amp_precisions);
    const std::string checkpoint_dir = amplab::checkpoint_dir_for(config.checkpoint, config.run, "mnist");

    // --resume: the checkpoint names the mode it belongs to and carries the finished modes' results.
    std::vector<mnist::ModeResult> finished;
    const amplab::ResumePoint resume = amplab::find_resume_point(cli.resume, checkpoint_dir, &run, "mnist");
    const std::string& resume_path = resume.path;
    std::string resume_mode;
    if (!resume_path.empty()) {
      const amplab::CheckpointInfo& info = resume.info;
      resume_mode = info.tag;
      bool known = false;
      for (const auto& m : modes) known |= m.label() == resume_mode;
      if (!known) throw amplab::Error("--resume: checkpoint '" + resume_path + "' is from mode '" + resume_mode +
                                      "', which mnist.modes does not include");
      if (!info.extra_json.empty())
        for (const auto& j : nlohmann::json::parse(info.extra_json)) finished.push_back(from_json(j));
    }

    std::map<std::string, std::vector<PhaseRow>> profiles;  // per mode label
    std::map<std::string, int> profile_counts;              // the steps each mode's profile took
    mnist::RunMode run_mode = [&](const mnist::Mode& mode) -> mnist::ModeResult {
      for (const auto& done : finished)
        if (done.mode == mode.label()) return done;  // finished before the interruption
      bool resuming = !resume_mode.empty();
      if (resuming && mode.label() != resume_mode) throw amplab::Error("internal: modes out of order on resume");
      resume_mode.clear();

      torch::Device device = mnist::device_for(mode);
      amplab::TrainConfig train_config = mnist::train_config_for(mode, config.train);
      if (!mode.needs_gpu()) train_config.epochs = config.mnist.cpu_epochs;
      amplab::log::info("== " + mode.label() + " on " + amplab::describe(device) + ", " +
                        std::to_string(train_config.epochs) + " epoch(s) ==");
      torch::manual_seed(static_cast<uint64_t>(config.run.seed));  // the same initial weights in every mode
      mnist::Net net = amplab::make_mnist_net(train_config);  // the fused network with train.fast_path
      mnist::place_model(net, device);
      bool channels_last = config.mnist.channels_last && device.is_cuda();
      if (channels_last) amplab::to_channels_last(*net);
      mnist::ResidentSplit train = mnist::make_resident(data.train, device, channels_last);
      mnist::ResidentSplit test = mnist::make_resident(data.test, device, channels_last);
      if (!config.mnist.init_weights.empty() && !resuming) {
        load_init_weights(net, config.mnist.init_weights);
        auto e = mnist::evaluate(net, test, config.mnist.eval_batch_size, train_config.precision);
        amplab::log::info("[" + mode.label() + "] weights from " + config.mnist.init_weights + "; before training: test accuracy " +
                          amplab::fixed(e.accuracy, 4) + " (" + std::to_string(std::llround(e.accuracy * test.size())) + "/" +
                          std::to_string(test.size()) + "), test loss " + amplab::fixed(e.loss, 4));
      }

      amplab::Trainer trainer(net.ptr(), [&](const amplab::Batch& b) { return mnist::nll_loss(net, b); }, train_config,
                              device, amplab::course_mechanisms(), config.memory, amplab::make_fast_path_optimizer);
      // The resident split, or (AMPLAB_MNIST_LOADER=prefetch) host batches through mnist::PrefetchingBatches.
      const std::unique_ptr<amplab::BatchSource> train_batches = mnist::make_train_batches(
          mnist::loader_from_environment(), data.train, train.images, train.labels,
          amplab::EpochSampler(train.size(), train_config.batch_size, static_cast<uint64_t>(config.run.seed), true,
                               train_config.drop_last),
          device, channels_last);
      amplab::BatchSource& batches = *train_batches;
      amplab::FitOptions options;
      options.lab = "mnist";
      options.tag = mode.label();
      options.config_yaml = config_yaml;
      options.data_seed = static_cast<uint64_t>(config.run.seed);
      options.run_dir = &run;
      options.trace = config.run.trace;
      options.checkpoint = config.checkpoint;
      options.checkpoint_dir = checkpoint_dir;
      options.resume = resuming ? resume_path : "";
      options.force_resume = cli.force;
      options.epochs_key = mode.needs_gpu() ? "train.epochs" : "mnist.cpu_epochs";
      nlohmann::json done = nlohmann::json::array();
      for (const auto& r : finished) done.push_back(to_json(r));
      options.checkpoint_extra = done.dump();
      options.evaluate = [&](int64_t) {
        auto e = mnist::evaluate(net, test, config.mnist.eval_batch_size, train_config.precision);
        return nlohmann::json{{"test_loss", e.loss}, {"test_accuracy", e.accuracy}};
      };
      const amplab::FastPathSteps fast = amplab::fast_path_steps(trainer);
      amplab::log::info("[" + mode.label() + "] " + fast.description);
      options.run_step = fast.run_step;
      amplab::FitResult fit = amplab::fit(trainer, batches, options);
      if (fit.status != amplab::FitStatus::completed) throw StopRun{fit.exit_code, fit.message};

      mnist::ModeResult result;
      result.mode = mode.label();
      result.ran = true;
      for (const auto& epoch : fit.epochs) {
        result.epoch_seconds.push_back(epoch.seconds);
        result.train_loss.push_back(epoch.train_loss);
        result.test_accuracy.push_back(epoch.eval.value("test_accuracy", 0.0));
      }
      if (fit.epochs.empty()) throw StopRun{amplab::kExitFailure, mode.label() + ": training ran no epoch"};
      const std::string weights = save_weights(net, result, config.data.dataset, test.size(), run);
      amplab::log::info("[" + mode.label() + "] weights: " + weights + " (safetensors; test accuracy " +
                        amplab::fixed(result.test_accuracy.back(), 4) + " = " +
                        std::to_string(std::llround(result.test_accuracy.back() * test.size())) + "/" +
                        std::to_string(test.size()) + "; in Python: bench/eval_safetensors.py " + weights + ")");
      result.seconds_per_epoch = fit.epochs.back().seconds;
      result.samples_per_second = fit.epochs.back().samples_per_second;
      // A run resumed at its end trained nothing here: its memory was measured by the run that trained it.
      if (!fit.already_finished) result.memory = mnist::memory_use(trainer.memory());
      else result.memory.source = "-";
      if (config.mnist.profile_steps > 0 && !fit.already_finished) {
        profile_counts[mode.label()] = profiled_steps(device, config.mnist.profile_steps);
        amplab::log::info("[" + mode.label() + "] profile: " + std::to_string(profile_counts[mode.label()]) +
                          " steps phase by phase, then back to back");
        auto rows = profile_step(trainer, batches, config.mnist.profile_steps);
        const double graphed = result.seconds_per_epoch * 1000.0 / static_cast<double>(batches.batches_per_epoch());
        rows.push_back({"the epoch's step (" + std::string(fast.run_step ? "CUDA graph" : "eager") +
                        ")", graphed, graphed});
        profiles[mode.label()] = rows;
      }
      finished.push_back(result);
      return result;
    };

    std::vector<mnist::ModeResult> results;
    try {
      results = mnist::run_benchmark(modes, amplab::cuda_available(), run_mode);
    } catch (const StopRun& stop) {
      amplab::log::error_to_file(stop.message);  // the console gets it once, below
      std::cerr << (stop.exit_code == amplab::kExitFailure ? "error: " : "") << stop.message << "\n";
      return stop.exit_code;
    }

    amplab::Table table({"mode", "s/epoch", "samples/s", "vs cpu", "peak MiB", "memory", "train loss", "test acc"});
    nlohmann::json summary_modes = nlohmann::json::array();
    nlohmann::json summary_profile = nlohmann::json::object();  // per mode, per phase (profile_step)
    std::string skipped;
    for (const auto& r : results) {
      summary_modes.push_back(to_json(r));
      for (const auto& m : modes)  // the path the mode ran: train_config_for sets it per mode
        if (r.ran && m.label() == r.mode) summary_modes.back()["fast_path"] = mnist::train_config_for(m, config.train).fast_path;
      if (!r.ran) {
        table.add_row({r.mode, "-", "-", "-", "-", "skipped", "-", "-"});
        skipped += "  " + r.mode + ": skipped, " + r.skipped_because + "\n";
        continue;
      }
      table.add_row({r.mode, amplab::fixed(r.seconds_per_epoch, 3), amplab::fixed(r.samples_per_second, 0),
                     r.speedup_vs_cpu > 0 ? amplab::fixed(r.speedup_vs_cpu, 1) + "x" : "-", amplab::fixed(r.memory.peak_mib, 1),
                     r.memory.source, amplab::fixed(r.train_loss.back(), 4), amplab::fixed(r.test_accuracy.back(), 4)});
    }
    std::cout << "\n" << table.to_string() << skipped;
    table.write_csv(run.file("results.csv"));
    if (!profiles.empty()) {
      amplab::Table phases({"mode", "phase", "host ms", "device ms", "share of the phases"});
      nlohmann::json profile_json = nlohmann::json::object();
      for (const auto& r : results) {
        auto found = profiles.find(r.mode);
        if (found == profiles.end()) continue;
        double total = 0;
        for (const auto& row : found->second)
          if (row.phase == "sum of the phases") total = row.device_ms;
        for (const auto& row : found->second) {
          const bool phase = row.phase == "data" || row.phase == "forward" || row.phase == "backward" || row.phase == "optimizer";
          phases.add_row({r.mode, row.phase, amplab::fixed(row.host_ms, 3), amplab::fixed(row.device_ms, 3),
                          phase && total > 0 ? amplab::fixed(100 * row.device_ms / total, 0) + "%" : "-"});
          profile_json[r.mode][row.phase] = {{"host_ms", row.host_ms}, {"device_ms", row.device_ms}};
        }
      }
      std::string counts;  // the sample behind each mode's medians, as taken
      for (const auto& [mode, steps] : profile_counts) counts += (counts.empty() ? "" : ", ") + mode + " " + std::to_string(steps);
      std::cout << "\nWhere a step's time goes (steps per mode: " << counts
                << "; medians; each phase alone between two synchronizations; host: the CPU issuing it, "
                   "device: until its last kernel ended):\n"
                << phases.to_string();
      phases.write_csv(run.file("phases.csv"));
      summary_profile = profile_json;
    }
    run.write_summary({{"modes", summary_modes}, {"dataset", config.data.dataset}, {"batch_size", config.train.batch_size},
                       {"fast_path", config.train.fast_path},  // the key; each mode's entry says the path it ran
                       {"profile", summary_profile}, {"config", amplab::config_yaml_to_json(config_yaml)}});  // bench/side_by_side.py reads it
    if (config.mnist.plots) amplab::make_plots("mnist", run);
    amplab::write_report(run);
    std::cout << "results: " << run.path() << "/ (results.csv, phases.csv, metrics.csv, summary.json, report.md, plots)\n";
    return amplab::kExitOk;
  });
}
