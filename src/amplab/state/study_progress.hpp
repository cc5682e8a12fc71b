// A study lab's rows kept across an interruption. A study trains or times one row after another
// (transformer_fp8's precisions); after each row the lab records the row's results here, and
// progress.json in the run directory holds them with the run's config, written atomically. A run
// started with `--resume <run dir>|latest` takes the rows the earlier run finished and runs only
// the others, so that a Ctrl-C costs at most the row it stopped.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

#include "amplab/report/run_dir.hpp"
#include <vector>

namespace amplab {

class StudyProgress {
 public:
  // This run's progress, in `run`. With `resume` (a run directory of this lab, or "latest": its
  // newest one with a progress.json under <run.out_dir>/<lab>/), the rows of that run, which must
  // have had the same config except for the keys `free_keys` start with (run.out_dir...), unless
  // `force`. Errors name the directory and the key.
  StudyProgress(const RunDir& run, const RunConfig& run_config, const std::string& config_yaml, const std::string& resume,
                bool force, const std::vector<std::string>& free_keys);

  // A row the resumed run finished, as recorded.
  std::optional<nlohmann::json> done(const std::string& row) const;
  // Records a finished row and writes progress.json.
  void record(const std::string& row, nlohmann::json value);
  const std::string& resumed_from() const { return resumed_from_; }  // "" on a fresh start

 private:
  void write() const;

  std::string path_;  // <run dir>/progress.json ("" for a run that writes nothing)
  std::string lab_, config_yaml_;
  nlohmann::json rows_ = nlohmann::json::object();
  std::string resumed_from_;
};

}  // namespace amplab
