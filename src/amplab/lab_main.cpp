// The start-up and finish every lab's main() shares (lab_main.hpp).
#include "amplab/lab_main.hpp"

#include <c10/util/Exception.h>

#include <filesystem>
#include <iostream>
#include <stdexcept>

#include "amplab/infra/device.hpp"
#include "amplab/infra/log.hpp"
#include "amplab/measure/memory_snapshot.hpp"
#include "amplab/report/plots.hpp"
#include "amplab/report/report.hpp"
#include "amplab/infra/paths.hpp"  // file_name_safe

namespace amplab {

std::string where_it_stopped(const std::string& current_phase, const std::string& stopped_before) {
  if (!stopped_before.empty()) return "before '" + stopped_before + "'";
  return current_phase.empty() ? "" : "in '" + current_phase + "'";
}

bool config_runs_on_cpu(const std::string& device_spec) { return !resolve_device(device_spec).is_cuda(); }

namespace detail {

dist::WorldInfo find_world(const LabInfo& info) {
  return info.one_process_per_rank ? dist::world_from_env() : dist::WorldInfo{};
}

RunDir open_run_dir(const RunConfig& run, const LabInfo& info, const dist::WorldInfo& world, const std::string& yaml) {
  if (world.is_main()) return RunDir::create(run, info.name, yaml);
  log::set_rank(world.rank);
  return RunDir::none();
}

namespace {

// One GPU per process: rank r of a job takes cuda:LOCAL_RANK when run.device is auto (on a
// machine with GPUs) or cuda; an index of its own would put several ranks on one GPU.
torch::Device rank_device(const std::string& spec, const dist::WorldInfo& world) {
  const torch::Device asked = resolve_device(spec);  // explains a bad spec, or cuda without a GPU
  if (!asked.is_cuda()) return asked;
  if (spec != "auto" && spec != "cuda")
    throw Error("run.device: " + spec + " names one GPU, but each of the " + std::to_string(world.world_size) +
                " ranks needs its own; use cuda or auto (rank r takes cuda:LOCAL_RANK), or cpu");
  const int count = cuda_device_count();
  if (world.local_rank >= count)
    throw Error("LOCAL_RANK is " + std::to_string(world.local_rank) + " but this node has " + std::to_string(count) +
                " GPU(s): start at most " + std::to_string(count) + " processes per node (--nproc-per-node " +
                std::to_string(count) + "), or use --set run.device=cpu");
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(world.local_rank));
}

}  // namespace

torch::Device start_run(const RunConfig& run, const std::string& title, const dist::WorldInfo& world) {
  apply_run_settings(run);
  torch::Device device = world.is_distributed() ? rank_device(run.device, world) : resolve_device(run.device);
  log::info("== " + title + ", on " + describe(device) + " ==");
  return device;
}

std::unique_ptr<GpuTimeline> start_watching(const RunConfig& config, const RunDir& run, torch::Device device) {
  if (config.memory_snapshot && run.enabled()) {
    if (start_memory_history(device))
      log::info("run.memory_snapshot: recording the CUDA allocator's history into memory_snapshot.pickle");
    else
      log::warn("run.memory_snapshot: the CPU has no caching allocator to record; no snapshot is written");
  }
  if (!config.gpu_monitor || !run.enabled() || !device.is_cuda()) return nullptr;
  auto timeline = std::make_unique<GpuTimeline>(device, run.file("gpu_monitor.csv"));
  if (!timeline->available()) {
    log::info("run.gpu_monitor: NVML (the driver's management library) is not available; no gpu_monitor.csv");
    return nullptr;
  }
  return timeline;
}

std::unique_ptr<PhaseTrace> start_phase_trace(const RunConfig& config, const RunDir& run, torch::Device device) {
  if (!config.trace || !run.enabled()) return nullptr;
  log::warn("run.trace: the profiler records every op and kernel; this run's timings carry its overhead "
            "(compare timings from a run without run.trace)");
  auto path_of = [run_dir = run.path()](const std::string& phase, int n) {
    std::string slug = file_name_safe(phase);
    if (slug.empty()) slug = "phase";
    return (std::filesystem::path(run_dir) / ("trace-" + slug + (n > 1 ? "-" + std::to_string(n) : "") + ".json")).string();
  };
  return std::make_unique<PhaseTrace>(path_of, device,
                                      PhaseTrace::Limits{config.trace_phases, config.trace_seconds, config.trace_budget_mb << 20});
}

namespace {

// The plots of a run that finished its work; a signal stops the drawing between two plots.
void draw_plots(const std::string& plots_of, const RunDir& run, bool gpu_monitor) {
  std::cout << std::flush;  // before the plot script writes to the same stream
  for (const std::string& plots : {plots_of, std::string(gpu_monitor ? "gpu_monitor" : "")})
    if (!plots.empty() && !interrupt_requested()) make_plots(plots, run);
}

// summary.json's account of how the run ended.
void record_status(Results& results, const RunEnd& end) {
  const bool stopped_early = !end.succeeded && end.signal != 0;
  results.set("status", end.succeeded ? "complete" : stopped_early ? "interrupted" : "failed");
  if (stopped_early)
    results.set("interrupted", {{"by", describe_interrupt(end.signal)}, {"where", end.where}, {"how_to_go_on", end.how_to_go_on}});
}

// The run's last line after a signal: where it stopped, what it kept, how to go on.
void say_where_it_stopped(const RunDir& run, const RunEnd& end) {
  const std::string where = run.enabled() ? run.path() + "/" : "rank 0's run directory";
  if (end.succeeded)
    log::warn("stopped by " + describe_interrupt(end.signal) + " after the run's work was done: its results are in " + where +
              " (a plot may be missing)");
  else if (!end.said_where)
    log::warn("stopped by " + describe_interrupt(end.signal) + (end.where.empty() ? "" : " " + end.where) +
              ": what finished before it is in " + where + " (summary.json and report.md marked partial); " + end.how_to_go_on);
}

}  // namespace

int finish_run(const RunConfig& config, const RunDir& run, Results& results, const std::string& plots_of,
               GpuTimeline* gpu_timeline, const RunEnd& end, int exit_code) {
  if (end.signal != 0) exit_code = interrupt_exit_code(end.signal);
  if (run.enabled()) {
    if (gpu_timeline) {
      gpu_timeline->stop();
      results.set("gpu_monitor", gpu_timeline->summary());
    }
    if (config.memory_snapshot && memory_history_recording()) write_memory_snapshot(run.file("memory_snapshot.pickle"));
    record_status(results, end);
    results.write(run);
    if (end.succeeded) draw_plots(plots_of, run, gpu_timeline != nullptr);
    try {
      write_report(run);
    } catch (const std::exception& e) {  // the results are written; the report is their summary
      log::warn(std::string("report.md not written: ") + e.what());
      if (exit_code == kExitOk) exit_code = kExitIo;
    }
  }
  RunEnd last = end;  // a signal may also come while the plots are drawn and the report written
  last.signal = interrupt_signal();
  if (last.signal != 0) {
    say_where_it_stopped(run, last);
    return interrupt_exit_code(last.signal);
  }
  if (end.succeeded && run.enabled()) std::cout << "\nresults: " << run.path() << "/\n";
  return exit_code;
}

}  // namespace detail

BodyEnd run_lab_body(const std::function<int()>& body, const std::string& size_keys) {
  const std::string lower = size_keys.empty() ? "the sizes set in the config (see --help)" : size_keys;
  try {
    return {body(), 0};
  } catch (const Interrupted& stop) {
    return {interrupt_exit_code(stop.signal()), stop.signal()};
  } catch (const c10::OutOfMemoryError& e) {
    std::string message = e.what_without_backtrace();
    throw std::runtime_error("out of GPU memory: " + message.substr(0, message.find('\n')) + "; lower " + lower);
  } catch (const c10::Error& e) {
    std::string message = e.what_without_backtrace();
    message = message.substr(0, message.find('\n'));
    if (message.find("can't allocate memory") == std::string::npos) throw;
    throw std::runtime_error("out of CPU memory: " + message + "; lower " + lower);
  } catch (const std::bad_alloc&) {
    throw std::runtime_error("out of CPU memory; lower " + lower);
  }
}

}  // namespace amplab
