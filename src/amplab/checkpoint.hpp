// Checkpoints that survive crashes and resume exactly.
//
// File layout: an 24-byte header (magic "AMPLABCK", format version, payload length, CRC-32 of the
// payload) followed by a torch::serialize archive holding the model's parameters and buffers,
// the optimizer state, the GradScaler state, the RNG states (CPU and every CUDA device), the
// training position, the resolved config and the torch version. Files are written atomically
// (files.hpp); loading verifies everything before it changes anything, so a bad file is an error
// and never a partial load.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <string>
#include <vector>

#include "amplab/config.hpp"
#include "amplab/grad_scaler.hpp"

namespace amplab {

constexpr uint32_t kCheckpointFormatVersion = 1;

struct CheckpointConfig {
  std::string dir = "";          // "" = <run.out_dir>/<lab>/checkpoints (shared by the lab's runs)
  int64_t every_steps = 0;       // also save every N optimizer steps (0: only at epoch ends)
  bool every_epoch = true;       // save at the end of each epoch
  int64_t keep_last = 3;         // keep this many step-*.ckpt files, delete older ones
  bool on_interrupt = true;      // save when Ctrl-C / SIGTERM stops the run

  template <class V>
  void fields(V& v) {
    v.field("dir", dir, "checkpoint directory (empty: <run.out_dir>/<lab>/checkpoints)");
    v.field("every_steps", every_steps, "save every N optimizer steps (0: off)", Range<int64_t>::at_least(0));
    v.field("every_epoch", every_epoch, "save at the end of each epoch");
    v.field("keep_last", keep_last, "how many checkpoints to keep", Range<int64_t>::at_least(1));
    v.field("on_interrupt", on_interrupt, "save when interrupted (SIGINT/SIGTERM)");
  }
};

// Where training stands. A checkpoint is only taken between optimizer steps, so resuming starts
// a fresh accumulation group at micro-batch `next_batch` of `epoch`.
struct TrainingPosition {
  int64_t epoch = 0;        // 0-based epoch in progress
  int64_t next_batch = 0;   // micro-batch index within the epoch to run next
  int64_t global_step = 0;  // optimizer steps taken so far
  uint64_t data_seed = 0;   // the sampler's seed (the epoch's order is derived from it)
};

// Everything a checkpoint captures, by reference.
struct TrainingState {
  torch::nn::Module& model;
  torch::optim::Optimizer& optimizer;
  GradScaler& scaler;
};

struct CheckpointInfo {
  uint32_t format_version = kCheckpointFormatVersion;
  std::string torch_version;
  std::string lab;          // which lab wrote it
  std::string tag;          // e.g. the mode of a multi-mode lab ("gpu-amp")
  std::string config_yaml;  // the resolved config of the run that wrote it
  std::string extra_json;   // lab-specific state
  TrainingPosition position;
};

std::string serialize_checkpoint(const TrainingState& state, const CheckpointInfo& info);
void save_checkpoint(const std::string& path, const TrainingState& state, const CheckpointInfo& info);
// Verifies the file (header, length, checksum, format version, lab, parameter names and shapes,
// optimizer kind) and only then restores the state into `state`, and the RNG states.
CheckpointInfo load_checkpoint(const std::string& path, TrainingState& state, const std::string& expected_lab,
                               bool restore_rng = true);
// Reads and verifies only the header and the metadata, without touching any state.
CheckpointInfo read_checkpoint_info(const std::string& path);

// step-00000042.ckpt files in one directory, a `latest` file naming the newest, pruning.
class CheckpointManager {
 public:
  CheckpointManager(std::string dir, int64_t keep_last);
  const std::string& dir() const { return dir_; }
  // Writes step-<global_step>.ckpt atomically, points `latest` at it, deletes old ones. Returns its path.
  std::string save(const TrainingState& state, const CheckpointInfo& info);
  // "latest" -> the file `latest` names; anything else is a path that must exist.
  std::string resolve(const std::string& spec) const;

 private:
  std::string dir_;
  int64_t keep_last_;
};

}  // namespace amplab
