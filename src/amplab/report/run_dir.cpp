// A run's directory (run_dir.hpp): creating it, config.yaml, CSV logs and summary.json.
#include "amplab/report/run_dir.hpp"

#include <ATen/Context.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>

#include "amplab/infra/device.hpp"
#include "amplab/infra/env.hpp"
#include "amplab/infra/error.hpp"
#include "amplab/infra/files.hpp"

namespace amplab {

namespace fs = std::filesystem;

namespace {
std::string local_time(const char* format) {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buffer[64];
  std::strftime(buffer, sizeof buffer, format, &tm);
  return buffer;
}
}  // namespace

CsvLog::CsvLog(const std::string& path, std::vector<std::string> columns, bool append)
    : columns_(columns.size()) {
  bool exists = fs::exists(path) && fs::file_size(path) > 0;
  file_ = std::make_unique<AppendFile>(path, /*truncate=*/!append);
  if (!append || !exists) row(columns);
}

void CsvLog::row(const std::vector<std::string>& cells) {
  if (!is_open()) return;
  std::string line;
  for (size_t i = 0; i < cells.size(); ++i) line += (i ? "," : "") + cells[i];
  file_->append(line + "\n");
  if (file_->pending_bytes() > 0 && !warned_) {
    warned_ = true;
    log::warn("cannot write " + file_->path() + " (disk full?): keeping its rows in memory and retrying with each new row");
  }
}

std::string check_device_spec(const std::string& spec) {
  if (spec == "auto" || spec == "cpu" || spec == "cuda") return "";
  if (spec.rfind("cuda:", 0) == 0 && spec.size() > 5 && spec.size() < 9 &&
      std::all_of(spec.begin() + 5, spec.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return "";
  return "expected auto, cpu, cuda or cuda:N (N = 0, 1, ...); got '" + spec + "'";
}

RunDir RunDir::none() { return RunDir(); }

namespace {
// A symbolic link on the way to out_dir whose target is missing ("File exists" says nothing), or `otherwise`.
std::string dangling_link_or(const std::string& out_dir, const std::string& otherwise) {
  std::error_code ec;
  for (fs::path at = fs::path(out_dir); !at.empty(); at = at.parent_path()) {
    if (fs::is_symlink(at, ec) && !fs::exists(at, ec))
      return "'" + at.string() + "' is a symbolic link to '" + fs::read_symlink(at, ec).string() +
             "', which does not exist; create its target or set run.out_dir elsewhere";
    if (at == at.parent_path()) break;
  }
  return otherwise;
}
}  // namespace

RunDir RunDir::create(const RunConfig& run, const std::string& lab, const std::string& resolved_config_yaml) {
  RunDir dir;
  dir.lab_ = lab;
  dir.started_at_ = local_time("%Y-%m-%dT%H:%M:%S%z");
  fs::path base = fs::path(run.out_dir) / lab;
  std::error_code ec;
  fs::create_directories(base, ec);
  if (ec) throw Error("run.out_dir: cannot create '" + base.string() + "': " + dangling_link_or(run.out_dir, ec.message()));
  std::string stamp = local_time("%Y%m%d-%H%M%S");
  fs::path path = base / stamp;
  for (int n = 2; !fs::create_directory(path, ec); ++n) {
    if (ec) throw Error("run.out_dir: cannot create '" + path.string() + "': " + ec.message());
    path = base / (stamp + "-" + std::to_string(n));
  }
  dir.path_ = path.string();
  dir.config_hash_ = hex32(crc32_of(resolved_config_yaml));
  write_file_atomic(dir.file("config.yaml"), resolved_config_yaml);
  log::init(run.log_level, dir.file(lab + ".log"));
  log::info("run directory: " + dir.path_);
  return dir;
}

std::string RunDir::file(const std::string& name) const { return (fs::path(path_) / name).string(); }

void RunDir::write_summary(const nlohmann::json& results) const {
  if (!enabled()) return;
  nlohmann::json summary = results;
  summary["lab"] = lab_;
  summary["started_at"] = started_at_;
  summary["finished_at"] = local_time("%Y-%m-%dT%H:%M:%S%z");
  summary["config_hash"] = config_hash_;
  summary["environment"] = to_json(collect_environment());
  write_file_atomic(file("summary.json"), summary.dump(2) + "\n");
}

void apply_run_settings(const RunConfig& run) {
  torch::manual_seed(static_cast<uint64_t>(run.seed));
  if (run.cudnn_benchmark && !run.deterministic) at::globalContext().setBenchmarkCuDNN(true);
  if (run.deterministic) {
    // cuBLAS is only deterministic with a fixed workspace, and reads this before its first use.
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
    at::globalContext().setDeterministicCuDNN(true);
    at::globalContext().setBenchmarkCuDNN(false);
  }
}

}  // namespace amplab
