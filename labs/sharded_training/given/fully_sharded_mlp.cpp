// FullyShardedMlp's constructor, forward loop and collectives (sharded_training.hpp): given, no
// TODOs. Each Linear's weight and bias move into one flat buffer per unit, of which this rank
// keeps its shard only; the Linear module itself is left with empty tensors.
#include <torch/torch.h>

#include "amplab/infra/error.hpp"
#include "sharded_training.hpp"

namespace zero_lab {

FullyShardedMlp::FullyShardedMlp(torch::nn::Sequential mlp, std::shared_ptr<amplab::dist::Communicator> comm,
                                 AdamWOptions options, bool prefetch, ShardedPrecision precision)
    : mlp_(std::move(mlp)), comm_(std::move(comm)), options_(options), prefetch_(prefetch), precision_(precision) {
  for (auto dtype : {precision.param_dtype, precision.reduce_dtype})
    if (dtype != torch::kFloat32 && dtype != torch::kBFloat16 && dtype != torch::kFloat16)
      throw amplab::Error(std::string("FullyShardedMlp: a precision must be float32, bfloat16 or float16, not ") +
                          c10::toString(dtype));
  torch::NoGradGuard no_grad;
  const auto rank = comm_->rank();
  for (const auto& layer : mlp_->children()) {
    auto* linear = layer->as<torch::nn::LinearImpl>();
    if (linear == nullptr) {
      if (!layer->parameters().empty())
        throw amplab::Error("FullyShardedMlp: layer " + std::to_string(unit_of_layer_.size()) + " (" + layer->name() +
                            ") has parameters but is not a Linear: only Linear layers are sharded here");
      unit_of_layer_.push_back(-1);
      continue;
    }
    if (!linear->bias.defined())
      throw amplab::Error("FullyShardedMlp: layer " + std::to_string(unit_of_layer_.size()) + " is a Linear without a bias");
    if (linear->weight.device() != comm_->device() || linear->weight.scalar_type() != torch::kFloat32)
      throw amplab::Error("FullyShardedMlp: the model must be fp32 on " + comm_->device().str() + " (the communicator's device)");
    Unit unit;
    unit.out = linear->weight.size(0);
    unit.in = linear->weight.size(1);
    unit.layout = flat_layout({linear->weight, linear->bias}, comm_->size());
    if (unit.layout.offsets.size() != 2 || unit.layout.padded_numel() < unit.layout.numel)
      throw amplab::Error("FullyShardedMlp: flat_layout gave a layout that does not hold a Linear (TODO sharded_training-1)");
    torch::Tensor whole = torch::zeros({unit.layout.padded_numel()}, linear->weight.options());
    whole.narrow(0, unit.layout.offsets[0], linear->weight.numel()).copy_(linear->weight.reshape(-1));
    whole.narrow(0, unit.layout.offsets[1], linear->bias.numel()).copy_(linear->bias);
    unit.shard = whole.narrow(0, unit.layout.shard_begin(rank), unit.layout.shard_numel).clone().requires_grad_(true);
    unit.grad_shard = torch::zeros({unit.layout.shard_numel}, linear->weight.options().dtype(precision_.reduce_dtype));
    unit.exp_avg = torch::zeros({unit.layout.shard_numel}, linear->weight.options());
    unit.exp_avg_sq = torch::zeros_like(unit.exp_avg);
    linear->weight.set_data(torch::empty({0}, linear->weight.options()));  // the whole parameters go
    linear->bias.set_data(torch::empty({0}, linear->bias.options()));
    unit_of_layer_.push_back(static_cast<int>(units_.size()));
    units_.push_back(std::move(unit));
  }
}

torch::Tensor FullyShardedMlp::forward(const torch::Tensor& x) {
  torch::Tensor h = x.to(precision_.param_dtype);
  size_t layer = 0;
  for (auto& module : *mlp_) {
    const int u = unit_of_layer_[layer++];
    h = u >= 0 ? sharded_linear(*this, static_cast<size_t>(u), h) : module.forward(h);
  }
  return h.to(torch::kFloat32);
}

torch::Tensor FullyShardedMlp::start_gather(Unit& unit) {
  unit.whole = torch::empty({unit.layout.padded_numel()}, unit.shard.options().dtype(precision_.param_dtype).requires_grad(false));
  unit.gathering = comm_->all_gather(unit.whole, unit.shard.detach().to(precision_.param_dtype));
  return unit.whole;
}

void FullyShardedMlp::prefetch(size_t u) {
  if (!prefetch_ || u >= units_.size() || units_[u].gathering) return;
  start_gather(units_[u]);
}

torch::Tensor FullyShardedMlp::gather(size_t u) {
  Unit& unit = units_.at(u);
  if (!unit.gathering) start_gather(unit);
  unit.gathering->wait();
  unit.gathering.reset();
  return std::move(unit.whole);  // the unit keeps no reference: the caller's is the last
}

void FullyShardedMlp::reduce_scatter_gradient(size_t u, const torch::Tensor& whole_gradient) {
  Unit& unit = units_.at(u);
  if (whole_gradient.numel() != unit.layout.padded_numel())
    throw amplab::Error("FullyShardedMlp: unit " + std::to_string(u) + "'s whole gradient has " +
                        std::to_string(whole_gradient.numel()) + " elements, its flat buffer " +
                        std::to_string(unit.layout.padded_numel()));
  if (unit.reducing)
    throw amplab::Error("FullyShardedMlp: unit " + std::to_string(u) + " got a second gradient before step()");
  // A collective holds its input until it is waited for. Waiting for the previous unit's
  // reduce-scatter here (the stream waits, not the host) lets its whole gradient go: backward
  // holds two layers' gradients at a time instead of every layer's until step(), as FSDP2 does.
  if (last_reducing_) last_reducing_->wait();
  unit.reducing = comm_->reduce_scatter(unit.grad_shard, whole_gradient.to(precision_.reduce_dtype).contiguous(),
                                        amplab::dist::Reduction::mean);
  last_reducing_ = unit.reducing;
}

void FullyShardedMlp::zero_grad() { last_reducing_.reset(); }

torch::Tensor FullyShardedMlp::full_parameters() {
  std::vector<torch::Tensor> parts;
  for (auto& unit : units_) {  // the fp32 shards themselves, whatever param_dtype gathers for compute
    torch::Tensor whole = torch::empty({unit.layout.padded_numel()}, unit.exp_avg.options());
    comm_->all_gather(whole, unit.shard.detach())->wait();
    parts.push_back(whole.narrow(0, 0, unit.layout.numel));
  }
  return torch::cat(parts);
}

int64_t FullyShardedMlp::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& unit : units_) bytes += unit.exp_avg.nbytes() + unit.exp_avg_sq.nbytes();
  return bytes;
}

}  // namespace zero_lab
