// The start-up and finish every lab's main() shares: the command line, the config (with its
// `cpu:` overlay on a CPU run), the run directory, the run settings, the device, and at the end
// the results (CSV files and summary.json), the plots and report.md. A lab's main() is then
//
//   int main(int argc, char** argv) {
//     return amplab::lab_main<MyConfig>(argc, argv, {"my_lab", "Lab 9: what it shows"},
//                                       [](amplab::Lab<MyConfig>& lab) { ...; return amplab::kExitOk; });
//   }
#pragma once

#include <torch/types.h>

#include <functional>
#include <optional>
#include <string>

#include "amplab/infra/app.hpp"
#include "amplab/infra/config.hpp"
#include "amplab/measure/gpu_timeline.hpp"
#include "amplab/measure/trace.hpp"
#include "amplab/report/results.hpp"
#include "amplab/report/run_dir.hpp"

namespace amplab {

struct LabInfo {
  std::string name;             // "amp_training": configs/<name>.yaml, runs/<name>/, labs/<name>/README.md
  std::string title;            // "Lab 2: AMP training, fp32 vs tf32 vs fp16 vs bf16"
  bool accepts_resume = false;  // --resume and --force are options of this lab
  // The config keys that set how much memory the lab takes ("amp.mlp.width, amp.mlp.batch"):
  // running out of CPU or GPU memory names them, with the bytes asked for.
  std::string size_keys;
  // The lab traces its own training steps under run.trace (fit's StepTrace, as mnist does), so
  // lab_main traces none of its phases.
  bool traces_own_steps = false;
};

// What a lab's body works with.
template <class Config>
struct Lab {
  Config config;
  CommandLine cli;
  ConfigSource source;   // where(key): the origin of a value, for errors across keys
  torch::Device device;  // resolved from run.device
  RunDir run;
  Results results;       // written to the run directory when the body returns
  std::string plot_kind; // scripts/plot.py's kind to draw at the end ("" for none)
  // The GPU's utilization through the run (run.gpu_monitor): null on the CPU or without NVML.
  std::unique_ptr<GpuTimeline> gpu_timeline = nullptr;
  // run.trace's trace of each phase: null unless asked (no profiler runs then).
  std::unique_ptr<PhaseTrace> phase_trace = nullptr;
  NvtxPhases nvtx;

  bool on_cpu() const { return !device.is_cuda(); }
  // Labels what the lab does from now on ("" for nothing): in gpu_monitor.csv and summary.json's
  // gpu_monitor, as an NVTX range (Nsight Systems), and with run.trace as trace-<name>.json.
  void phase(const std::string& name) {
    if (gpu_timeline) gpu_timeline->phase(name);
    nvtx.phase(name);
    if (phase_trace) phase_trace->phase(name);
  }
};

// Whether run.device ("auto", "cpu", "cuda:1") resolves to the CPU on this machine.
bool config_runs_on_cpu(const std::string& device_spec);

namespace detail {
// Everything lab_main does around the config; defined in lab_main.cpp.
torch::Device start_run(const RunConfig& run, const std::string& title);
// The GPU timeline and the allocator's history, as run.gpu_monitor and run.memory_snapshot ask.
std::unique_ptr<GpuTimeline> start_watching(const RunConfig& config, const RunDir& run, torch::Device device);
// run.trace: warns that the timings carry the profiler's overhead, and unless the lab traces its
// own steps, returns the trace of each phase into <run dir>/trace-<phase>.json (null when off,
// and on a rank that writes no files).
std::unique_ptr<PhaseTrace> start_phase_trace(const RunConfig& config, const RunDir& run, torch::Device device,
                                              bool lab_traces_own_steps);
// A run that failed (`succeeded` false) keeps its results and report but draws no plots and
// prints nothing after its error line.
void finish_run(const RunConfig& config, const RunDir& run, Results& results, const std::string& plot_kind,
                GpuTimeline* gpu_timeline, bool succeeded);
// Runs `body`; running out of memory becomes one line naming `size_keys`.
int run_body(const std::function<int()>& body, const std::string& size_keys);
}  // namespace detail

// Loads the config: the file, its `cpu:` section when run.device resolves to the CPU, then --set.
// The `cpu:` section is checked whatever the device, so that a mistake in it shows on a GPU too.
template <class Config>
std::pair<Config, ConfigSource> load_config_for_device(const CommandLine& cli, bool* on_cpu_out = nullptr) {
  ConfigSource source = ConfigSource::load(cli.config_path, cli.overrides);
  Config config;
  source.bind(config);
  ConfigSource cpu_source = source.with_overlay("cpu");
  Config cpu_config;
  cpu_source.bind(cpu_config);
  const bool on_cpu = config_runs_on_cpu(config.run.device);
  if (on_cpu_out) *on_cpu_out = on_cpu;
  if (on_cpu) return {std::move(cpu_config), std::move(cpu_source)};
  return {std::move(config), std::move(source)};
}

// A look at the loaded config before anything is made: it throws amplab::Error to refuse values
// that do not go together, or returns an exit code to stop with at once (a lab that cannot run
// on this machine), or nothing to go on.
template <class Config>
using ConfigCheck = std::function<std::optional<int>(const Config&, const ConfigSource&)>;

// Runs a lab: parses the command line, loads the config, runs `check` (when given), creates the
// run directory, applies the run settings, resolves the device and prints the title, runs `body`,
// then writes the results, the plots and report.md. Errors become one line and an exit code
// (guarded_main).
template <class Config>
int lab_main(int argc, char** argv, const LabInfo& info, const ConfigCheck<Config>& check,
             const std::function<int(Lab<Config>&)>& body) {
  return guarded_main([&]() -> int {
    Config defaults;
    CommandLine cli;
    if (auto code = parse_command_line(argc, argv, info.name, info.title, describe_keys(defaults), cli, info.accepts_resume))
      return *code;
    auto [config, source] = load_config_for_device<Config>(cli);
    if (check)
      if (auto code = check(config, source)) return *code;
    RunDir run = RunDir::create(config.run, info.name, to_yaml(config));
    torch::Device device = detail::start_run(config.run, info.title);
    auto gpu_timeline = detail::start_watching(config.run, run, device);
    auto phase_trace = detail::start_phase_trace(config.run, run, device, info.traces_own_steps);
    Lab<Config> lab{std::move(config), cli, std::move(source), device, std::move(run), Results{}, "", std::move(gpu_timeline),
                    std::move(phase_trace), {}};
    const int code = detail::run_body([&] { return body(lab); }, info.size_keys);
    if (lab.phase_trace) lab.phase_trace->finish();  // the last phase's trace, before the results are written
    detail::finish_run(lab.config.run, lab.run, lab.results, code == kExitOk ? lab.plot_kind : "", lab.gpu_timeline.get(),
                       code == kExitOk);
    return code;
  });
}

template <class Config>
int lab_main(int argc, char** argv, const LabInfo& info, const std::function<int(Lab<Config>&)>& body) {
  return lab_main<Config>(argc, argv, info, nullptr, body);
}

}  // namespace amplab
