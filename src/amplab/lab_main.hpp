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

#include <csignal>
#include <functional>
#include <optional>
#include <string>

#include "amplab/dist/world.hpp"
#include "amplab/infra/app.hpp"
#include "amplab/infra/config.hpp"
#include "amplab/infra/signals.hpp"
#include "amplab/measure/gpu_timeline.hpp"
#include "amplab/measure/trace.hpp"
#include "amplab/report/results.hpp"
#include "amplab/report/run_dir.hpp"
#include "amplab/train/checkpointer.hpp"
#include "amplab/train/loop.hpp"

namespace amplab {

struct LabInfo {
  // Both from labs/<lab>/lab.yaml, through the generated lab_identity.hpp (this_lab::kName, kTitle).
  std::string name;             // "amp_training": configs/<name>.yaml, runs/<name>/, labs/<name>/
  std::string title;            // "Lab 2: AMP training, fp32 vs tf32 vs fp16 vs bf16"
  bool accepts_resume = false;  // --resume and --force are options of this lab
  // The config keys that set how much memory the lab takes ("amp.mlp.width, amp.mlp.batch"):
  // running out of CPU or GPU memory names them, with the bytes asked for.
  std::string size_keys;
  // What --resume takes in this lab, for --help ("" for checkpoints: a file, latest or auto).
  std::string resume_help;
  // One process per GPU, started by amplab-run or torchrun (the DDP lab): each process reads its
  // place in the job from the launcher's environment (dist::world_from_env), takes the GPU
  // numbered like its LOCAL_RANK, and only rank 0 writes a run directory; the other ranks log
  // warnings and errors, prefixed with their rank. Started alone, the process is rank 0 of 1.
  bool one_process_per_rank = false;
};

// What a lab's body works with.
template <class Config>
struct Lab {
  Lab(std::string name, Config config, CommandLine cli, ConfigSource source, torch::Device device, RunDir run,
      dist::WorldInfo world, std::string size_keys)
      : name(std::move(name)), config(std::move(config)), cli(std::move(cli)), source(std::move(source)), device(device),
        run(std::move(run)), world(std::move(world)), size_keys(std::move(size_keys)) {}

  std::string name;      // the lab's (lab.yaml): runs/<name>/, its checkpoints' lab
  Config config;
  CommandLine cli;
  ConfigSource source;   // where(key): the origin of a value, for errors across keys
  torch::Device device;  // resolved from run.device: on a rank of a job, cuda:LOCAL_RANK
  RunDir run;            // rank 0's; none on the other ranks of a job
  // This process's place in the job (LabInfo::one_process_per_rank), else rank 0 of 1.
  dist::WorldInfo world;
  // The keys an out-of-memory line names (LabInfo::size_keys); a body may narrow them to what it runs.
  std::string size_keys;
  Results results;       // written to the run directory when the body returns
  bool draw_plots = false;  // labs/<lab>/plots.py draws the run's plots at the end (scripts/plot.py)
  // The GPU's utilization through the run (run.gpu_monitor): null on the CPU or without NVML.
  std::unique_ptr<GpuTimeline> gpu_timeline = nullptr;
  // run.trace's trace of each phase: null unless asked (no profiler runs then).
  std::unique_ptr<PhaseTrace> phase_trace = nullptr;
  NvtxPhases nvtx;
  std::string current_phase;  // the last phase() named
  std::string stopped_before;  // the phase a stop signal kept from starting
  // How an interrupted run goes on, for its last line; a lab that resumes sets its own.
  std::string how_to_go_on = "run the lab again to measure the rest";

  // A lab with several ranks sets this to an agreement over them (dist::loop_hooks(comm).any):
  // phase() is then a collective, so that a signal that reaches one rank just before a phase and
  // another just after stops both there, rather than leaving one waiting in the other's next
  // collective. Every rank must then call phase() with the same names in the same order.
  std::function<bool(bool)> any_rank = nullptr;

  bool on_cpu() const { return !device.is_cuda(); }

  // What every fit() of a lab that trains through the core's loop shares: the lab's name and its
  // resolved config for the checkpoints, the data seed (run.seed), the run directory, the
  // checkpoint: section with its directory resolved (checkpoint.dir, else
  // <run.out_dir>/<lab>/checkpoints), and --resume and --force as given. The caller adds the tag,
  // the evaluation, the distributed hooks and the fast path's step.
  FitOptions fit_options(const std::string& tag)  // not const: to_yaml walks the config's fields()
    requires requires(Config& c) { c.checkpoint; c.run; }
  {
    FitOptions options;
    options.lab = name;
    options.tag = tag;
    options.config_yaml = to_yaml(config);
    options.data_seed = static_cast<uint64_t>(config.run.seed);
    options.run_dir = &run;
    options.checkpoint = resolved_checkpoint_config(config.checkpoint, config.run, name);
    options.resume = cli.resume;
    options.force_resume = cli.force;
    return options;
  }
  // Labels what the lab does from now on ("" for nothing): in gpu_monitor.csv and summary.json's
  // gpu_monitor, as an NVTX range (Nsight Systems), and with run.trace as trace-<name>.json.
  // A new phase is a safe point: after Ctrl-C the run stops here (Interrupted, signals.hpp).
  // With several ranks, all of them stop before the same phase: see any_rank.
  void phase(const std::string& name) {
    if (!name.empty()) {
      const int signal = interrupt_signal();
      if (any_rank ? any_rank(signal != 0) : signal != 0) {
        stopped_before = name;
        throw Interrupted(signal != 0 ? signal : SIGINT);
      }
    }
    current_phase = name;
    if (gpu_timeline) gpu_timeline->phase(name);
    nvtx.phase(name);
    if (phase_trace) phase_trace->phase(name);
  }
};

// Runs `work`, then `record`, which puts the rows `work` measured into the results (and prints
// them); also when a stop signal ends `work` at a safe point, so that the rows finished before it
// are kept; the run then stops.
inline void run_then_record(const std::function<void()>& work, const std::function<void()>& record) {
  try {
    work();
  } catch (const Interrupted&) {
    record();
    throw;
  }
  record();
}

// "before 'matmul'" when a stop signal kept that phase from starting, else "in '<current>'".
std::string where_it_stopped(const std::string& current_phase, const std::string& stopped_before);

// Whether run.device ("auto", "cpu", "cuda:1") resolves to the CPU on this machine.
bool config_runs_on_cpu(const std::string& device_spec);

namespace detail {
// Everything lab_main does around the config; defined in lab_main.cpp.
// This process's place: from the launcher's environment when the lab runs one process per rank.
dist::WorldInfo find_world(const LabInfo& info);
// The run directory: created by rank 0; none on the other ranks, whose console then shows only
// warnings and errors, prefixed with the rank.
RunDir open_run_dir(const RunConfig& run, const LabInfo& info, const dist::WorldInfo& world, const std::string& yaml);
// Applies the run settings, resolves run.device (on a rank of a job: cuda:LOCAL_RANK for auto or
// cuda) and prints the title.
torch::Device start_run(const RunConfig& run, const std::string& title, const dist::WorldInfo& world);
// The GPU timeline and the allocator's history, as run.gpu_monitor and run.memory_snapshot ask.
std::unique_ptr<GpuTimeline> start_watching(const RunConfig& config, const RunDir& run, torch::Device device);
// run.trace: warns that the timings carry the profiler's overhead, and returns the trace of each
// phase into <run dir>/trace-<phase>.json (null when off, and on a rank that writes no files).
std::unique_ptr<PhaseTrace> start_phase_trace(const RunConfig& config, const RunDir& run, torch::Device device);
// What the run's end writes and says.
struct RunEnd {
  bool succeeded = false;   // the body finished its work
  int signal = 0;           // a stop signal arrived at any time (the exit code is then 128 + signal)
  bool said_where = false;  // the body already said where it stopped (fit's interrupted line)
  std::string where;        // where it stopped: "in 'fp16'", "before 'matmul'" ("" when unknown)
  std::string how_to_go_on;
};
// Writes summary.json (with its "status": complete, failed or interrupted) and the CSV files,
// then the plots (a run that finished its work), then report.md (marked partial when the run did
// not finish). Nothing here throws past the run except a failed write of its results.
int finish_run(const RunConfig& config, const RunDir& run, Results& results, const std::string& plots_of,
               GpuTimeline* gpu_timeline, const RunEnd& end, int exit_code);
}  // namespace detail

// How a lab's body ended.
struct BodyEnd {
  int exit_code = 0;
  int interrupted_by = 0;  // the signal that stopped it before the end (Interrupted), or 0
};
// Runs a lab's body: running out of CPU or GPU memory becomes one line naming `size_keys` (the
// config keys that set the sizes), and a stop signal at a safe point (Interrupted) an exit code.
BodyEnd run_lab_body(const std::function<int()>& body, const std::string& size_keys);

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

// Runs a lab: installs the interrupt policy for the whole run, parses the command line, loads
// the config, runs `check` (when given), finds the process's place in the job (one process per
// rank), creates the run directory (rank 0), applies the run settings, resolves the device and
// prints the title, runs `body`, then writes the results, the plots and report.md. Errors become
// one line and an exit code (guarded_main).
template <class Config>
int lab_main(int argc, char** argv, const LabInfo& info, const ConfigCheck<Config>& check,
             const std::function<int(Lab<Config>&)>& body) {
  return guarded_main([&]() -> int {
    InterruptHandler interrupts;  // until the process exits: plots and report.md included
    Config defaults;
    CommandLine cli;
    if (auto code = parse_command_line(argc, argv, info.name, info.title, describe_keys(defaults), cli, info.accepts_resume,
                                        info.resume_help))
      return *code;
    auto [config, source] = load_config_for_device<Config>(cli);
    if (check)
      if (auto code = check(config, source)) return *code;
    const dist::WorldInfo world = detail::find_world(info);
    RunDir run = detail::open_run_dir(config.run, info, world, to_yaml(config));
    torch::Device device = detail::start_run(config.run, info.title, world);
    auto gpu_timeline = detail::start_watching(config.run, run, device);
    auto phase_trace = detail::start_phase_trace(config.run, run, device);
    Lab<Config> lab(info.name, std::move(config), cli, std::move(source), device, std::move(run), world, info.size_keys);
    lab.gpu_timeline = std::move(gpu_timeline);
    lab.phase_trace = std::move(phase_trace);
    const BodyEnd ended = run_lab_body([&] { return body(lab); }, lab.size_keys);
    if (lab.phase_trace) lab.phase_trace->finish();  // the last phase's trace, before the results are written
    const detail::RunEnd end{.succeeded = ended.exit_code == kExitOk, .signal = interrupt_signal(),
                             .said_where = ended.interrupted_by == 0 && ended.exit_code != kExitOk,
                             .where = where_it_stopped(lab.current_phase, lab.stopped_before),
                             .how_to_go_on = lab.how_to_go_on};
    return detail::finish_run(lab.config.run, lab.run, lab.results, lab.draw_plots ? info.name : "", lab.gpu_timeline.get(), end,
                              ended.exit_code);
  });
}

template <class Config>
int lab_main(int argc, char** argv, const LabInfo& info, const std::function<int(Lab<Config>&)>& body) {
  return lab_main<Config>(argc, argv, info, nullptr, body);
}

}  // namespace amplab
