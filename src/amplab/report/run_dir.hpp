// A run's directory, runs/<lab>/<YYYYmmdd-HHMMSS>/, and what every run writes into it:
// config.yaml (the resolved config), <lab>.log, metrics.csv, summary.json.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "amplab/infra/append_file.hpp"
#include "amplab/infra/config.hpp"
#include "amplab/infra/log.hpp"
#include "amplab/infra/paths.hpp"

namespace amplab {

// "" when `spec` is auto, cpu, cuda or cuda:N, else what is wrong (whether the device exists is
// checked when it is used).
std::string check_device_spec(const std::string& spec);

// Settings every lab shares, under `run:` in its YAML.
struct RunConfig {
  std::string device = "auto";
  int64_t seed = 0;
  std::string out_dir = "runs";
  log::Level log_level = log::Level::info;
  bool deterministic = false;
  bool cudnn_benchmark = false;
  bool gpu_monitor = true;
  bool memory_snapshot = false;
  bool trace = false;
  std::vector<std::string> trace_phases;
  double trace_seconds = 1.0;
  int64_t trace_budget_mb = 50;

  template <class V>
  void fields(V& v) {
    v.field("device", device, "where to run: auto, cpu, cuda or cuda:N", check_device_spec);
    v.field("seed", seed, "seed of torch's CPU and CUDA generators", Range<int64_t>::at_least(0));
    v.field("out_dir", out_dir, "run directories are created under <out_dir>/<lab>/", check_path_value);
    v.field("log_level", log_level, "console log level");
    v.field("deterministic", deterministic, "use deterministic kernels (repeatable to the bit, slower)");
    v.field("cudnn_benchmark", cudnn_benchmark, "cuDNN tries its algorithms per shape and keeps the fastest (not with deterministic)");
    v.field("gpu_monitor", gpu_monitor,
            "on a GPU: sample its utilization, memory, power, clock and temperature 20 times a second into gpu_monitor.csv");
    v.field("memory_snapshot", memory_snapshot,
            "on a GPU: record every allocation and free into memory_snapshot.pickle (open it at pytorch.org/memory_viz)");
    v.field("trace", trace,
            "write a profiler trace of each phase the lab marks into trace-<phase>.json, as trace_phases, trace_seconds "
            "and trace_budget_mb allow (open them in ui.perfetto.dev; a traced run's timings carry the profiler's "
            "overhead; train.trace_steps traces a window of training steps instead)");
    v.field("trace_phases", trace_phases,
            "with trace: trace only the phases whose name contains one of these words (empty: every phase)");
    v.field("trace_seconds", trace_seconds,
            "with trace: a phase's trace ends at its first training step or timed window after this "
            "many seconds; the rest of the phase runs untraced",
            Range<double>::between(0.001, 86400));
    v.field("trace_budget_mb", trace_budget_mb,
            "with trace: start no phase's trace once the traces written reach this many MiB",
            Range<int64_t>::between(1, 100000));
  }
};

// Appends rows to a CSV file as they come (written per row), so a crashed run keeps its
// metrics. Rows the disk refuses are kept and written later (AppendFile), never dropped silently.
class CsvLog {
 public:
  CsvLog() = default;
  CsvLog(const std::string& path, std::vector<std::string> columns, bool append = false);
  void row(const std::vector<std::string>& cells);
  bool is_open() const { return file_ && file_->is_open(); }

 private:
  std::unique_ptr<AppendFile> file_;
  size_t columns_ = 0;
  bool warned_ = false;
};

class RunDir {
 public:
  // Creates <out_dir>/<lab>/<YYYYmmdd-HHMMSS>[-N]/, starts logging to <lab>.log there, and writes
  // `resolved_config_yaml` to config.yaml.
  static RunDir create(const RunConfig& run, const std::string& lab, const std::string& resolved_config_yaml);
  // A run directory that writes nothing (ranks other than 0 in distributed runs).
  static RunDir none();

  bool enabled() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const;  // <path>/<name>
  const std::string& lab() const { return lab_; }

  // summary.json: `results` plus the environment (torch, CUDA, cuDNN, GPU, driver, CPU, git
  // commit), the config hash and the wall time. Written atomically; call again to update.
  void write_summary(const nlohmann::json& results) const;

 private:
  std::string path_;
  std::string lab_;
  std::string config_hash_;  // CRC-32 of config.yaml, hex
  std::string started_at_;   // ISO 8601 local time
};

// Seeds torch's generators and sets the deterministic switches from `run`.
void apply_run_settings(const RunConfig& run);

}  // namespace amplab
