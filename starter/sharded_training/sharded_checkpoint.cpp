// Your copy of this lab's code: fill in every TODO(...) below; the tests tell you which one
// fails. (Instructors: generated from solution/ by scripts/make-starter.py; edit the solution.)
// Lab 8: ZeRO-3's sharded checkpoint. See labs/sharded_training/README.md, "A sharded checkpoint".
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <filesystem>
#include <map>

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
void save_sharded(FullyShardedModel& model, const std::string& dir) {
  AMPLAB_TODO("sharded_training-6");
}

// TODO(sharded_training-6): each rank reads `dir`/rank-<r>-of-<W>.safetensors
// (amplab::load_safetensors, which checks the file's format and names the file in its errors),
// checks it against this job and this model (world size, rank, every unit's tensors present
// with their shapes), and only then copies each tensor into the model and sets the step count
// (model.set_steps). A checkpoint of another world size has other files: a missing file names
// the world size it would need.
// Pitfall: copying as you check leaves a half-loaded model when a later tensor is wrong.
void load_sharded(FullyShardedModel& model, const std::string& dir) {
  AMPLAB_TODO("sharded_training-6");
}

// TODO(sharded_training-7): load a checkpoint that save_sharded wrote on W' ranks (any number)
// into this job's W ranks. Find W' from the files' names (`dir`/rank-0-of-<W'>.safetensors).
// Each unit's flat buffer was cut into W' shards of shard_numel(numel, W') elements
// (amplab::dist::shard_numel), laid end to end: element i of the unit lies in saved rank
// i / s' at offset i % s'. This rank's new shard covers [rank x s, rank x s + s) of the same
// flat buffer, with s its layout's shard_numel. Fill it, and its two moments, from the saved
// pieces that overlap it; elements at or past the unit's numel are padding, zero. Read only the
// files you need, each once. As in load_sharded, check everything (each file there, each
// tensor there with s' elements, the same step count in every file you read) before copying
// anything, then set the step count.
// Pitfalls: copying saved shard r into new shard r works only when W' == W; the last saved
// shard, and the last new one, may be partly padding; a rank's new shard may span two or more
// saved shards, or lie entirely in the padding.
void load_resharded(FullyShardedModel& model, const std::string& dir) {
  AMPLAB_TODO("sharded_training-7");
}

}  // namespace zero_lab
