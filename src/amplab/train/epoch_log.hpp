// An epoch's numbers and where they go: EpochRecord and the running EpochSums (with their JSON for
// checkpoints), the loss window read at log points, steps.csv, metrics.csv, the console's epoch
// line and the memory report.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "amplab/measure/memory.hpp"
#include "amplab/measure/timing.hpp"
#include "amplab/report/run_dir.hpp"
#include "amplab/train/trainer.hpp"

namespace amplab {

struct EpochRecord {  // also kept in checkpoints, so that a resumed run reports every epoch
  std::string tag;
  int64_t epoch = 0;              // 1-based in reports
  double train_loss = 0;          // mean over the epoch's optimizer steps
  double seconds = 0;             // training time of the epoch (evaluation excluded)
  double samples_per_second = 0;
  int64_t steps = 0;              // optimizer steps in this epoch
  int64_t skipped_steps = 0;      // steps the GradScaler skipped (fp16)
  double loss_scale = 1.0;        // at the end of the epoch
  nlohmann::json eval;            // what FitOptions::evaluate returned
};
void to_json(nlohmann::json& j, const EpochRecord& record);
void from_json(const nlohmann::json& j, EpochRecord& record);  // a null train_loss (NaN) reads as NaN

// The running sums of the epoch in progress: what its EpochRecord is made of. Kept in
// checkpoints, so that an interrupted epoch reports the same mean loss as an uninterrupted one.
struct EpochSums {
  double loss_sum = 0;     // of the finite losses read so far
  int64_t loss_count = 0;
  int64_t samples = 0;     // this rank's samples
  int64_t steps = 0;
  int64_t skipped = 0;     // steps the GradScaler skipped
  double seconds = 0;      // training time before the last resume
};
void to_json(nlohmann::json& j, const EpochSums& sums);
void from_json(const nlohmann::json& j, EpochSums& sums);

// The steps since the last log point. Their losses stay on the device until read(): one host sync.
class LossWindow {
 public:
  struct Reading {
    std::vector<double> losses;  // mean over ranks, one per step
    int64_t skipped = 0;         // steps the GradScaler skipped
    int64_t samples = 0;         // this rank's
    int64_t steps = 0;
    double seconds = 0;          // since the window opened (after the sync)
  };
  void add(const StepResult& step);
  bool empty() const { return pending_.empty(); }
  void restart_clock() { clock_.restart(); }
  // Reads the window, `mean` averaging over ranks, and opens the next one.
  Reading read(const std::function<torch::Tensor(const torch::Tensor&)>& mean);

 private:
  std::vector<torch::Tensor> pending_;
  torch::Tensor skipped_;
  int64_t samples_ = 0, steps_ = 0;
  Stopwatch clock_;
};

// What the main process writes about the run: steps.csv at log points, the console's epoch line
// and metrics.csv per epoch, the memory report at the end. Ranks other than the main write nothing.
class EpochLog {
 public:
  EpochLog(std::string tag, const RunDir* run_dir, bool main);
  const std::string& tag_prefix() const { return tag_prefix_; }  // "[tag] " or ""
  // The progress bar's note of a log point, and its steps.csv row.
  std::string window_note(const LossWindow::Reading& window, double scale, bool scaling) const;
  void step_row(int64_t epoch, int64_t global_step, const LossWindow::Reading& window, double scale, int64_t skipped);
  void epoch_done(const EpochRecord& record);
  void leak_warning(const MemoryTracker& memory) const;  // after each epoch
  void memory_report(const MemoryTracker& memory, torch::Device device) const;  // at the end

 private:
  std::string tag_, tag_prefix_;
  const RunDir* run_dir_;
  bool main_;
  std::unique_ptr<CsvLog> steps_csv_, metrics_csv_;
};

}  // namespace amplab
