// ShardedGradientsAdamW's constructor, hooks and bookkeeping (sharded_training.hpp): given, no
// TODOs. Each bucket's parameters move into a flat buffer of their own; each gets a hook that
// tells gradient_ready when autograd has accumulated its gradient.
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include "amplab/infra/error.hpp"
#include "amplab/train/grad_ready_hook.hpp"
#include "sharded_training.hpp"

namespace zero_lab {

ShardedGradientsAdamW::ShardedGradientsAdamW(std::vector<std::vector<torch::Tensor>> buckets,
                                             std::shared_ptr<amplab::dist::Communicator> comm, AdamWOptions options)
    : comm_(std::move(comm)), options_(options) {
  auto options_f32 = torch::TensorOptions().dtype(torch::kFloat32).device(comm_->device());
  torch::NoGradGuard no_grad;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const std::string where = "ShardedGradientsAdamW: bucket " + std::to_string(b);
    if (buckets[b].empty()) throw amplab::Error(where + " has no parameters");
    for (const auto& p : buckets[b]) {
      if (!p.defined() || p.scalar_type() != torch::kFloat32 || !p.requires_grad())
        throw amplab::Error(where + ": every parameter must be a defined fp32 tensor that requires a gradient");
      if (p.device() != comm_->device())
        throw amplab::Error(where + ": a parameter is on " + p.device().str() + " but the communicator works on " +
                            comm_->device().str() + ": move the model there first");
    }
    Bucket bucket;
    bucket.params = std::move(buckets[b]);
    bucket.layout = flat_layout(bucket.params, comm_->size());
    if (bucket.layout.offsets.size() != bucket.params.size() || bucket.layout.padded_numel() < bucket.layout.numel)
      throw amplab::Error(where + ": flat_layout gave a layout that does not hold its parameters (TODO sharded_training-1)");
    bucket.flat_params = torch::zeros({bucket.layout.padded_numel()}, options_f32);
    for (size_t i = 0; i < bucket.params.size(); ++i) {
      auto& p = bucket.params[i];
      auto place = bucket.flat_params.narrow(0, bucket.layout.offsets[i], p.numel()).view(p.sizes());
      place.copy_(p);
      p.set_data(place);
      p.mutable_grad().reset();
      amplab::set_grad_ready_hook(p, [this, b] { gradient_ready(b); });
    }
    bucket.grad_shard = torch::zeros({bucket.layout.shard_numel}, options_f32);
    bucket.exp_avg = torch::zeros({bucket.layout.shard_numel}, options_f32);
    bucket.exp_avg_sq = torch::zeros({bucket.layout.shard_numel}, options_f32);
    bucket.pending = bucket.params.size();
    buckets_.push_back(std::move(bucket));
  }
}

ShardedGradientsAdamW::~ShardedGradientsAdamW() {
  for (auto& b : buckets_)
    for (auto& p : b.params) amplab::remove_grad_ready_hook(p);
}

void ShardedGradientsAdamW::zero_grad() {
  for (auto& b : buckets_)
    for (auto& p : b.params) p.mutable_grad().reset();
}

int64_t ShardedGradientsAdamW::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& b : buckets_) bytes += b.exp_avg.nbytes() + b.exp_avg_sq.nbytes();
  return bytes;
}

int64_t ShardedGradientsAdamW::gradient_bytes() const {
  int64_t bytes = 0;
  for (const auto& b : buckets_) {
    bytes += b.grad_shard.nbytes();
    for (const auto& p : b.params)
      if (p.grad().defined()) bytes += p.grad().nbytes();
  }
  return bytes;
}

}  // namespace zero_lab
