// A study lab's rows kept across an interruption (study_progress.hpp).
#include "amplab/state/study_progress.hpp"

#include <filesystem>
#include <system_error>

#include "amplab/infra/config_json.hpp"
#include "amplab/infra/error.hpp"
#include "amplab/infra/files.hpp"
#include "amplab/infra/paths.hpp"

namespace amplab {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFileName = "progress.json";

// The newest progress.json among <out_dir>/<lab>/*/ other than this run's own.
std::string latest_progress(const RunConfig& run_config, const std::string& lab, const std::string& own) {
  const fs::path runs = fs::path(run_config.out_dir) / lab;
  std::error_code error;
  std::string newest;
  fs::file_time_type newest_time;
  for (fs::directory_iterator it(runs, error), end; !error && it != end; it.increment(error)) {
    const fs::path candidate = it->path() / kFileName;
    std::error_code ignored;
    const auto time = fs::last_write_time(candidate, ignored);
    if (ignored || candidate.string() == own) continue;
    if (newest.empty() || time > newest_time) newest = candidate.string(), newest_time = time;
  }
  if (newest.empty())
    throw Error("--resume latest: no interrupted run of " + lab + " under " + runs.string() +
                " (none has a progress.json); leave --resume out to start fresh");
  return newest;
}

std::string progress_file_of(const std::string& resume, const RunConfig& run_config, const std::string& lab,
                             const std::string& own) {
  if (resume == "latest" || resume == "auto") return latest_progress(run_config, lab, own);
  fs::path path = resume;
  std::error_code error;
  if (fs::is_directory(path, error)) path /= kFileName;
  if (!regular_file_problem(path.string()).empty())
    throw Error("--resume " + resume + ": no " + std::string(kFileName) + " there; pass the run directory of an " +
                "interrupted " + lab + " run (runs/" + lab + "/<time>/), or latest");
  return path.string();
}

}  // namespace

StudyProgress::StudyProgress(const RunDir& run, const RunConfig& run_config, const std::string& config_yaml,
                             const std::string& resume, bool force, const std::vector<std::string>& free_keys)
    : path_(run.enabled() ? run.file(kFileName) : ""), lab_(run.lab()), config_yaml_(config_yaml) {
  if (resume.empty()) return;
  const std::string file = progress_file_of(resume, run_config, lab_, path_);
  nlohmann::json saved = nlohmann::json::parse(read_file(file), nullptr, /*allow_exceptions=*/false);
  if (!saved.is_object() || saved.value("lab", "") != lab_ || !saved.contains("rows") || !saved["rows"].is_object() ||
      !saved.contains("config_yaml") || !saved["config_yaml"].is_string())
    throw Error("--resume: " + file + " is not the progress of a " + lab_ + " run (damaged, or another lab's)");
  const ConfigDifference d = first_config_difference(saved["config_yaml"].get<std::string>(), config_yaml, free_keys);
  if (!d.key.empty() && !force)
    throw Error("--resume: " + file + " was measured with another config (" + d.key + " was " + d.before + ", now " + d.now +
                "); resume with the same config, or pass --force to keep its rows anyway");
  rows_ = saved["rows"];
  resumed_from_ = fs::path(file).parent_path().string();
  write();  // this run's own progress starts with them: a second interruption keeps them too
}

std::optional<nlohmann::json> StudyProgress::done(const std::string& row) const {
  if (!rows_.contains(row)) return std::nullopt;
  return rows_.at(row);
}

void StudyProgress::record(const std::string& row, nlohmann::json value) {
  rows_[row] = std::move(value);
  write();
}

void StudyProgress::write() const {
  if (path_.empty()) return;
  const nlohmann::json file{{"lab", lab_}, {"config_yaml", config_yaml_}, {"rows", rows_}};
  write_file_atomic(path_, file.dump(1) + "\n");
}

}  // namespace amplab
