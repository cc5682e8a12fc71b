// The epoch loop around Trainer::step(): batches, logging every log_every steps (the only host
// syncs besides fp16's skip decision), metrics files, divergence guard, checkpoints, Ctrl-C,
// out-of-memory handling and exact resume. fit() calls its parts: the Checkpointer
// (checkpointer.hpp: --resume and saving), EpochLog (epoch_log.hpp) and the guards (guards.hpp).
#pragma once

#include <torch/types.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "amplab/state/checkpoint.hpp"
#include "amplab/data/batches.hpp"
#include "amplab/report/run_dir.hpp"
#include "amplab/train/epoch_log.hpp"
#include "amplab/train/trainer.hpp"

namespace amplab {

enum class FitStatus { completed, interrupted, diverged, out_of_memory };

struct FitResult {
  FitStatus status = FitStatus::completed;
  int exit_code = 0;               // 0, 130/143 (interrupted), 1 (diverged / out of memory)
  std::string message;             // why it stopped, when it did not complete
  std::string last_checkpoint;     // the last good checkpoint of this run or the one it resumed ("" if none)
  std::vector<EpochRecord> epochs; // every finished epoch, those before a resume included
  TrainingPosition position;       // where it stopped
  bool already_finished = false;   // resumed from a checkpoint at the end of the run: nothing was trained
};

// Cross-process agreement for distributed runs; the defaults are single-process.
struct DistributedHooks {
  bool is_main = true;                                               // writes files and logs
  bool distributed = false;                                          // more than one process
  int64_t world_size = 1;
  // Rank 0's value on every rank (the checkpoint a resume loads must be the same file everywhere).
  std::function<std::string(const std::string&)> from_main = [](const std::string& mine) { return mine; };
  std::function<bool(bool)> any = [](bool local) { return local; };  // true if true on any rank
  std::function<torch::Tensor(const torch::Tensor&)> mean = [](const torch::Tensor& t) { return t; };
};

struct FitOptions {
  std::string lab;                 // checkpoints record it and refuse another lab's
  std::string tag;                 // labels rows in metrics.csv and the checkpoint (e.g. "gpu-amp")
  std::string config_yaml;         // saved into checkpoints
  uint64_t data_seed = 0;          // the sampler's seed, kept in checkpoints
  const RunDir* run_dir = nullptr; // metrics.csv, steps.csv, memory timeline (nullptr: none)
  // When to save, and where, its directory resolved (Lab::fit_options, or resolved_checkpoint_config
  // in checkpointer.hpp): a config whose dir is empty is refused, naming checkpoint.dir, since it
  // would silently save nothing. None: a run that saves no checkpoints.
  std::optional<CheckpointConfig> checkpoint;
  std::string resume;              // --resume as given: a path, "latest", "auto" (latest if there is one) or ""
  bool force_resume = false;       // --force: resume although settings the position depends on changed
  std::string epochs_key = "train.epochs";  // the config key that set config.epochs (for messages)
  std::string checkpoint_extra;    // lab state saved with each checkpoint (CheckpointInfo::extra_json)
  std::function<nlohmann::json(int64_t epoch)> evaluate;  // after each epoch (epoch 1-based)
  DistributedHooks dist;
  // Runs one optimizer step over micro-batches [first_batch, first_batch + batches) of the
  // epoch; empty: Trainer::step, eagerly. The fast path (a CUDA graph of the step) plugs in here.
  std::function<StepResult(BatchSource& data, int64_t first_batch, int64_t batches)> run_step;
};

// Trains from options.resume (or from the start) to the end of config.epochs. Resuming refuses,
// in one line naming the key and both values, settings the position depends on that changed
// since the checkpoint (batch size, world size, accumulation, the training set, precision, the
// schedule...), unless options.force_resume. Checkpoints are only written with finite
// parameters, so the last one is always good; fit() says which it is when training diverges.
FitResult fit(Trainer& trainer, BatchSource& data, const FitOptions& options);

}  // namespace amplab
