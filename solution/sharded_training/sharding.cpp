// Lab 8: the flat buffer's layout and the memory each stage leaves on a rank. See
// labs/sharded_training/README.md, "One flat buffer, W shards" and "What each stage removes".
#include <algorithm>

#include "amplab/dist/communicator.hpp"
#include "sharded_training.hpp"

namespace zero_lab {

// TODO(sharded_training-1): lay `params` out back to back in their order: offsets[i] is where parameter i
// starts, numel the elements of all of them. Cut the buffer into `world_size` shards of equal
// length, shard_numel elements each, so that every rank's reduce-scatter and all-gather move the
// same number of elements: the buffer is world_size * shard_numel long, and the elements past
// numel are padding (zeros, never a parameter).
// Pitfalls: numel / world_size rounded down leaves the last parameters' elements outside every
// shard (nobody steps them); a world of one rank is one shard of exactly numel elements; a
// parameter may be any shape (count its elements, not its first dimension).
FlatLayout flat_layout(const std::vector<torch::Tensor>& params, int world_size) {
  // BEGIN SOLUTION
  FlatLayout layout;
  layout.world_size = world_size;
  for (const auto& p : params) {
    layout.offsets.push_back(layout.numel);
    layout.numel += p.numel();
  }
  layout.shard_numel = amplab::dist::shard_numel(layout.numel, world_size);
  return layout;
  // END SOLUTION
}

// TODO(sharded_training-3): the bytes one rank holds, by part, for `num_params` parameters trained with AdamW.
// In fp32 a parameter is 4 bytes, its gradient 4, and AdamW keeps two moments of 4 bytes each. In
// mixed precision the parameters and gradients are bf16 (2 bytes each) and the optimizer also
// keeps an fp32 master copy of every parameter (4 bytes), which is optimizer state. Stage 0
// (DDP) keeps everything whole on every rank; stage 1 shards the optimizer state, stage 2 also
// the gradients, stage 3 also the parameters. A sharded part holds one shard: the ceiling of
// num_params / world_size elements (the padding counts: it is allocated).
// Pitfalls: which part the fp32 master copy belongs to decides what stage 1 saves; a model that
// does not divide by the world size still gives every rank a whole shard.
MemoryEstimate estimate_memory(int64_t num_params, int world_size, int stage, bool mixed_precision) {
  // BEGIN SOLUTION
  const int64_t shard = amplab::dist::shard_numel(num_params, world_size);
  const int64_t weight_bytes = mixed_precision ? 2 : 4;
  const int64_t state_bytes = mixed_precision ? 12 : 8;  // (fp32 master +) two fp32 moments
  MemoryEstimate m;
  m.optimizer_state = state_bytes * (stage >= 1 ? shard : num_params);
  m.gradients = weight_bytes * (stage >= 2 ? shard : num_params);
  m.parameters = weight_bytes * (stage >= 3 ? shard : num_params);
  return m;
  // END SOLUTION
}

}  // namespace zero_lab
