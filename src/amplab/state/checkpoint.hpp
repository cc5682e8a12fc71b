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
#include <set>
#include <string>
#include <vector>

#include "amplab/infra/config.hpp"
#include "amplab/train/loss_scaler.hpp"
#include "amplab/infra/paths.hpp"

namespace amplab {

// The format's version, in the header and in the archive (both must agree). Every change to the
// entries a checkpoint holds bumps it: a new entry, a removed or renamed one, a changed type or
// meaning. A build reads its own version and each older one whose entries it still describes (an
// entry added in version N says `since N`, and a file older than N may lack it); any other
// version is refused by name. The versions:
//   1  the first format (position_samples, position_world_size and meta_loop came late in it)
//   2  every entry described once (the fields() below); the archive's own version is checked
constexpr uint32_t kCheckpointFormatVersion = 2;
constexpr uint32_t kOldestReadableCheckpointVersion = 1;

struct CheckpointConfig {
  std::string dir = "";
  int64_t every_steps = 0;
  bool every_epoch = true;
  int64_t keep_last = 3;
  bool on_interrupt = true;

  template <class V>
  void fields(V& v) {
    v.field("dir", dir, "checkpoint directory (empty: <run.out_dir>/<lab>/checkpoints, shared by the lab's runs)",
            check_path_value);
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
  int64_t next_batch = 0;   // micro-batch index within the epoch to run next (on every rank)
  int64_t global_step = 0;  // optimizer steps taken so far
  uint64_t data_seed = 0;   // the sampler's seed (the epoch's order is derived from it)
  // Samples of the epoch trained on so far, all ranks together. Ranks take the epoch's order
  // interleaved (EpochSampler), so these are exactly its first `samples` entries, whatever the
  // batch size and world size: the position survives a change of either (--force).
  int64_t samples = 0;
  int64_t world_size = 1;   // processes that trained it

  // Each entry once: its key in the archive and the version that added it (checkpoint.cpp's
  // writer and reader both walk this list).
  template <class V>
  void fields(V& v) {
    v.entry("position_epoch", epoch);
    v.entry("position_next_batch", next_batch);
    v.entry("position_global_step", global_step);
    v.entry("position_data_seed", data_seed);
    v.entry("position_samples", samples, /*since=*/2);
    v.entry("position_world_size", world_size, /*since=*/2);
  }
};

// Everything a checkpoint captures, by reference.
struct TrainingState {
  torch::nn::Module& model;
  torch::optim::Optimizer& optimizer;
  LossScaler& scaler;
};

struct CheckpointInfo {
  uint32_t format_version = kCheckpointFormatVersion;
  std::string torch_version;
  std::string lab;          // which lab wrote it
  std::string tag;          // e.g. the mode of a multi-mode lab ("gpu-amp")
  std::string config_yaml;  // the resolved config of the run that wrote it
  std::string extra_json;   // lab-specific state
  std::string loop_json;    // the training loop's own state (loop.cpp): finished epochs, running sums
  TrainingPosition position;

  template <class V>
  void fields(V& v) {  // format_version is the archive's first entry, read before these
    v.entry("meta_torch_version", torch_version);
    v.entry("meta_lab", lab);
    v.entry("meta_tag", tag);
    v.entry("meta_config", config_yaml);
    v.entry("meta_extra", extra_json);
    v.entry("meta_loop", loop_json, /*since=*/2);
    position.fields(v);
  }
};

std::string serialize_checkpoint(const TrainingState& state, const CheckpointInfo& info);
void save_checkpoint(const std::string& path, const TrainingState& state, const CheckpointInfo& info);
// Verifies the file (header, length, checksum, format version, lab, parameter names and shapes,
// optimizer kind) and only then restores the state into `state`, and the RNG states.
CheckpointInfo load_checkpoint(const std::string& path, TrainingState& state, const std::string& expected_lab,
                               bool restore_rng = true);
// Reads and verifies only the header and the metadata, without touching any state.
CheckpointInfo read_checkpoint_info(const std::string& path);
// Refuses a checkpoint of another lab by name ("" expects any).
void check_checkpoint_lab(const CheckpointInfo& info, const std::string& path, const std::string& expected_lab);

// The checkpoints of one directory: <owner>-step-00000042.ckpt files and a `latest` file naming
// the newest. Several runs may share the directory one after the other (the default is one per
// lab): each run prunes only the files it wrote itself, so the checkpoint an interrupted run
// printed survives the next run. Two runs writing at once are refused (a lock).
// With a `pointer_dir` (<run.out_dir>/<lab>, beside the run directories) the run's own `latest`
// is written there too, naming the file by a path relative to it (absolute when outside it), and
// read first: runs of other out_dirs sharing the directory never move it. The directory's own
// `latest` (the newest file written there by any run) is read when the run's is missing.
class CheckpointManager {
 public:
  // `owner` names the writer in file names (a run directory's name and a mode); "" gives plain
  // step-00000042.ckpt files.
  CheckpointManager(std::string dir, int64_t keep_last, std::string owner = "", std::string pointer_dir = "");
  ~CheckpointManager();
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;
  const std::string& dir() const { return dir_; }
  // Before the first save (save() calls it too): creates the directory, takes its lock for this
  // object's lifetime and removes temporary files left by a killed write. An amplab::Error names
  // the directory when it cannot be written, or the process that holds the lock.
  void open_for_writing();
  // Writes <owner>-step-<global_step>.ckpt atomically, points the `latest` files at it, then deletes this
  // owner's older files beyond keep_last. Returns its path. A file of that name that this object
  // did not write is never replaced (an amplab::Error names it): it is another run's.
  std::string save(const TrainingState& state, const CheckpointInfo& info);
  // "latest" -> the file `latest` names; anything else is a path that must exist.
  std::string resolve(const std::string& spec) const;
  // Whether there is a `latest` (what --resume auto asks).
  bool has_latest() const;

 private:
  bool directory_latest_is_ours() const;
  std::string resolve_run_pointer(const std::string& pointer) const;
  std::string resolve_dir_pointer(const std::string& pointer) const;
  std::string dir_;
  std::string pointer_dir_;
  int64_t keep_last_;
  std::string owner_;
  int lock_fd_ = -1;
  std::set<std::string> written_;  // names of the files this object saved
};

// Six random hex digits: the part of a checkpoint's name no other run shares.
std::string unique_run_token();

}  // namespace amplab
