// Which samples go into which batch: a permutation per epoch from a shared seed, sharded across
// ranks the way torch.utils.data.DistributedSampler does (same permutation for the same seed).
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace amplab {

class EpochSampler {
 public:
  // rank/world_size: this process's shard (0/1 in single-process runs). With drop_last the tail
  // that does not fill a whole batch is skipped; otherwise the last batch is smaller.
  EpochSampler(int64_t dataset_size, int64_t batch_size, uint64_t seed, bool shuffle, bool drop_last,
               int rank = 0, int world_size = 1);

  // Reshuffles: the permutation of epoch e comes from a generator seeded with seed + e.
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }

  int64_t batches_per_epoch() const;
  int64_t samples_per_rank() const { return static_cast<int64_t>(shard_.size(0)); }
  int64_t batch_size() const { return batch_size_; }
  // Indices (int64, CPU) of batch `index` of this rank in the current epoch.
  torch::Tensor batch_indices(int64_t index) const;
  // This rank's whole epoch order (int64, CPU).
  const torch::Tensor& order() const { return shard_; }

 private:
  int64_t dataset_size_, batch_size_;
  uint64_t seed_;
  bool shuffle_, drop_last_;
  int rank_, world_size_;
  int64_t epoch_ = -1;
  torch::Tensor shard_;
};

}  // namespace amplab
