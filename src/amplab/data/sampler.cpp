// EpochSampler (sampler.hpp): each epoch's permutation, sharded across ranks, cut into batches.
#include "amplab/data/sampler.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "amplab/infra/error.hpp"

namespace amplab {

EpochSampler::EpochSampler(int64_t dataset_size, int64_t batch_size, uint64_t seed, bool shuffle, bool drop_last,
                           int rank, int world_size)
    : dataset_size_(dataset_size), batch_size_(batch_size), seed_(seed), shuffle_(shuffle), drop_last_(drop_last),
      rank_(rank), world_size_(world_size) {
  if (dataset_size <= 0) throw Error("sampler: the dataset is empty");
  if (batch_size <= 0) throw Error("sampler: batch size must be >= 1");
  if (world_size <= 0 || rank < 0 || rank >= world_size)
    throw Error("sampler: rank " + std::to_string(rank) + " is outside world size " + std::to_string(world_size));
  set_epoch(0);
}

void EpochSampler::set_epoch(int64_t epoch) {
  if (epoch == epoch_) return;
  epoch_ = epoch;
  torch::Tensor order;
  if (shuffle_) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(seed_ + static_cast<uint64_t>(epoch));
    order = torch::randperm(dataset_size_, generator, torch::kInt64);
  } else {
    order = torch::arange(dataset_size_, torch::kInt64);
  }
  // Every rank gets the same number of samples: pad by wrapping around (as DistributedSampler
  // does when drop_last is false), then take every world_size-th index starting at rank.
  int64_t per_rank = (dataset_size_ + world_size_ - 1) / world_size_;
  int64_t total = per_rank * world_size_;
  if (total > dataset_size_) {
    int64_t padding = total - dataset_size_;
    torch::Tensor pad = order.narrow(0, 0, std::min(padding, dataset_size_));
    while (pad.size(0) < padding) pad = torch::cat({pad, order}).narrow(0, 0, padding);
    order = torch::cat({order, pad});
  }
  shard_ = order.slice(0, rank_, total, world_size_).contiguous();
}

int64_t EpochSampler::batches_per_epoch() const {
  int64_t n = samples_per_rank();
  return drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
}

torch::Tensor EpochSampler::batch_indices(int64_t index) const {
  if (index < 0 || index >= batches_per_epoch())
    throw Error("sampler: batch " + std::to_string(index) + " is outside 0.." + std::to_string(batches_per_epoch() - 1));
  int64_t start = index * batch_size_;
  int64_t length = std::min(batch_size_, samples_per_rank() - start);
  return shard_.narrow(0, start, length);
}

}  // namespace amplab
