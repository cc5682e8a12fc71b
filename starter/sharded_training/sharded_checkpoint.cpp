// Your copy of this lab's code: fill in every TODO(...) below; the tests tell you which one
// fails. (Instructors: generated from solution/ by scripts/make-starter.py; edit the solution.)
// Lab 8: ZeRO-3's sharded checkpoint. See labs/sharded_training/README.md, "A sharded checkpoint".
#include <torch/csrc/autograd/grad_mode.h>

#include <filesystem>

#include "amplab/infra/error.hpp"
#include "amplab/state/safetensors.hpp"
#include "sharded_training.hpp"

namespace zero_lab {

// TODO(sharded_training-6): each rank saves its own part. Write `dir`/rank-<r>-of-<W>.safetensors
// (amplab::save_safetensors: the course's safetensors writer, atomic) holding, for each unit u,
// its shard and its two moments under names of your choosing (e.g. "unit0.shard"), and as
// metadata (strings) the step count, the rank and the world size. Then wait for the other ranks
// (a barrier): the checkpoint exists only once every rank's file does.
// Pitfalls: a rank that writes the whole model defeats the point (and W ranks writing it race
// for the same file); the step count is part of the state: AdamW's bias correction needs it to
// go on exactly.
void save_sharded(FullyShardedMlp& model, const std::string& dir) {
  AMPLAB_TODO("sharded_training-6");
}

// TODO(sharded_training-6): each rank reads `dir`/rank-<r>-of-<W>.safetensors
// (amplab::load_safetensors, which checks the file's format and names the file in its errors),
// checks it against this job and this model (world size, rank, every unit's tensors present
// with their shapes), and only then copies each tensor into the model and sets the step count
// (model.set_steps). A checkpoint of another world size has other files: a missing file names
// the world size it would need.
// Pitfalls: copying as you check leaves a half-loaded model when a later tensor is wrong; the
// shards require grad: copy into them under torch::NoGradGuard.
void load_sharded(FullyShardedMlp& model, const std::string& dir) {
  AMPLAB_TODO("sharded_training-6");
}

}  // namespace zero_lab
