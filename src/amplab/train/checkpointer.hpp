// The checkpoint directory and --resume end to end: where checkpoints and the `latest` pointer
// live, resolving --resume, loading with the checks a resume makes, and when (and what) to save.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "amplab/state/checkpoint.hpp"
#include "amplab/train/epoch_log.hpp"
#include "amplab/train/loop.hpp"

namespace amplab {

// The default checkpoint directory of a lab: <run.out_dir>/<lab>/checkpoints unless set.
std::string checkpoint_dir_for(const CheckpointConfig& checkpoint, const RunConfig& run, const std::string& lab);
// The checkpoint: section as fit() takes it (FitOptions::checkpoint): its dir resolved.
CheckpointConfig resolved_checkpoint_config(const CheckpointConfig& checkpoint, const RunConfig& run,
                                            const std::string& lab);

// Where a run's `latest` pointer lives: beside its run directory, <run.out_dir>/<lab>, so that runs
// of different out_dirs sharing a checkpoint directory each resume their own; "" without a run
// directory (the checkpoint directory's `latest` then).
std::string latest_pointer_dir(const RunDir* run_dir);

// --resume resolved once: "auto" is the latest checkpoint if there is one, else "" (a fresh
// start); "latest" the file the pointer names; anything else a path that must exist.
std::string resolve_resume(const std::string& flag, const CheckpointManager& checkpoints);

// For an app that must know which checkpoint it resumes before fit() (the mode it belongs to, a
// lab's state): the flag resolved and the file's header read, another lab's checkpoint refused.
struct ResumePoint {
  std::string path;  // "" : a fresh start
  CheckpointInfo info;
};
ResumePoint find_resume_point(const std::string& flag, const std::string& checkpoint_dir, const RunDir* run_dir,
                              const std::string& lab);

// What the position in the data and the learning rate depend on, with the key that sets each.
struct Setting {
  std::string name;  // in the checkpoint
  std::string key;   // in messages ("" when read back from a checkpoint)
  nlohmann::json value;
};
struct PositionSettings {
  std::vector<Setting> list;
};
void to_json(nlohmann::json& j, const PositionSettings& settings);    // {name: value}
void from_json(const nlohmann::json& j, PositionSettings& settings);
PositionSettings position_settings(const TrainConfig& config, const FitOptions& options, int64_t dataset_size);

// The loop's part of a checkpoint (CheckpointInfo::loop_json): the settings, the finished epochs
// and the sums of the epoch in progress. Checkpoints of older builds may lack any of them.
struct LoopState {
  PositionSettings settings;
  std::vector<EpochRecord> epochs;
  EpochSums sums;
};
void to_json(nlohmann::json& j, const LoopState& state);
void from_json(const nlohmann::json& j, LoopState& state);

// A resume's starting point.
struct Resumed {
  TrainingPosition position;
  LoopState loop;
  bool finished = false;  // the checkpoint is at the end of the run: nothing left to train
};

class Checkpointer {
 public:
  // Opens the checkpoint directory for writing now when the run saves: a directory that cannot
  // be written is found before training.
  Checkpointer(const FitOptions& options, Trainer& trainer, PositionSettings settings);
  ~Checkpointer();

  // Loads options.resume (rank 0's file on every rank) after checking lab, tag and settings;
  // nullopt for a fresh start.
  std::optional<Resumed> resume(int64_t global_batch);

  bool saves_at_step(int64_t global_step) const;      // checkpoint.every_steps
  bool saves_at_epoch_end(bool interrupted) const;    // checkpoint.every_epoch, on_interrupt
  bool saves_on_interrupt() const;
  // Writes a checkpoint at `at` unless the parameters (or, without loss scaling, the last losses)
  // are not finite: a diverged run never replaces its good checkpoints with bad ones. Returns its
  // path, or "" when nothing was written (also on ranks other than the main one).
  std::string save(const TrainingPosition& at, const std::vector<EpochRecord>& epochs, const EpochSums& sums,
                   bool losses_finite);

  const std::string& last_good() const { return last_good_; }  // "" if none
  int64_t last_good_step() const { return last_good_step_; }
  std::string last_good_note() const;  // "; the last good checkpoint is '...' (step N)"
  // What an interrupted run says: where it stopped, what was saved, how to go on.
  std::string interrupted_message(int64_t epoch, int64_t global_step, const std::string& saved, bool finished) const;

 private:
  std::string resolved_resume() const;
  void apply(Resumed& resumed, const std::string& path, int64_t global_batch) const;
  void announce(const Resumed& resumed, const std::string& path) const;
  const FitOptions& options_;
  Trainer& trainer_;
  PositionSettings settings_;
  std::unique_ptr<CheckpointManager> checkpoints_;
  std::string last_good_;  // the newest checkpoint with finite parameters
  int64_t last_good_step_ = 0;
};

}  // namespace amplab
