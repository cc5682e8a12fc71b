// ShardedAdamW's constructor (sharded_training.hpp): given, no TODOs. The parameters move into one flat
// buffer, their gradients into another, and the optimizer state is this rank's shard only.
#include <torch/csrc/autograd/grad_mode.h>

#include "amplab/infra/error.hpp"
#include "sharded_training.hpp"

namespace zero_lab {

ShardedAdamW::ShardedAdamW(std::vector<torch::Tensor> params, std::shared_ptr<amplab::dist::Communicator> comm,
                           AdamWOptions options)
    : params_(std::move(params)), comm_(std::move(comm)), options_(options) {
  for (const auto& p : params_) {
    if (!p.defined() || p.scalar_type() != torch::kFloat32)
      throw amplab::Error("ShardedAdamW: every parameter must be a defined fp32 tensor");
    if (p.device() != comm_->device())
      throw amplab::Error("ShardedAdamW: a parameter is on " + p.device().str() + " but the communicator works on " +
                          comm_->device().str() + ": move the model there first");
  }
  layout_ = flat_layout(params_, comm_->size());
  if (static_cast<size_t>(layout_.offsets.size()) != params_.size() || layout_.padded_numel() < layout_.numel)
    throw amplab::Error("ShardedAdamW: flat_layout gave " + std::to_string(layout_.offsets.size()) + " offsets for " +
                        std::to_string(params_.size()) + " parameters and " + std::to_string(layout_.padded_numel()) +
                        " elements for " + std::to_string(layout_.numel) + " (TODO sharded_training-1)");
  auto options_f32 = torch::TensorOptions().dtype(torch::kFloat32).device(comm_->device());
  flat_params_ = torch::zeros({layout_.padded_numel()}, options_f32);
  flat_grads_ = torch::zeros({layout_.padded_numel()}, options_f32);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    auto place = [&](const torch::Tensor& flat) { return flat.narrow(0, layout_.offsets[i], p.numel()).view(p.sizes()); };
    place(flat_params_).copy_(p);
    p.set_data(place(flat_params_));  // the parameter is now a view of the flat buffer
    p.mutable_grad() = place(flat_grads_);  // and backward accumulates into the flat gradient
  }
  // This rank's shard of the flat gradient itself: the reduce-scatter runs in place, and stage 1
  // holds no gradient beyond the full one it already has.
  grad_shard_ = flat_grads_.narrow(0, layout_.shard_begin(comm_->rank()), layout_.shard_numel);
  exp_avg_ = torch::zeros({layout_.shard_numel}, options_f32);
  exp_avg_sq_ = torch::zeros({layout_.shard_numel}, options_f32);
}

}  // namespace zero_lab
