// Lab 8: ZeRO-3 (FSDP), a unit's four moments and the step. See labs/sharded_training/README.md,
// "ZeRO-3: parameters gathered when they are used".
#include <torch/torch.h>

#include "amplab/infra/error.hpp"
#include "sharded_training.hpp"

namespace zero_lab {

// TODO(sharded_training-5): a prefetch. Start unit u's all-gather (start_gather(u): it gives the
// unit's whole buffer its memory and sets unit.gathering) and return at once, so that it travels
// while something else computes. Nothing when prefetching is off (prefetch_), when u is out of
// range (the layer after the last, the one before the first), or when the unit is already
// gathered or on its way.
// Pitfall: gathering a unit twice allocates its whole buffer twice (start_gather refuses).
void FullyShardedModel::prefetch(size_t u) {
  // BEGIN SOLUTION
  if (!prefetch_ || u >= units_.size()) return;
  const Unit& unit = units_[u];
  if (unit.gathered || unit.gathering) return;
  start_gather(u);
  // END SOLUTION
}

// TODO(sharded_training-5): unit u gathered, ready to compute with. Nothing when it is already;
// else wait for its prefetch (unit.gathering->wait(): on a GPU the compute stream waits for the
// all-gather, the host goes on), or gather it now if none was issued, then forget the Work and
// mark it gathered (unit.gathered).
// Pitfall: a prefetch nobody waits for: the layer computes with memory the all-gather is still
// writing (run_unit refuses a unit whose Work was not waited for and forgotten).
void FullyShardedModel::unshard(size_t u) {
  // BEGIN SOLUTION
  Unit& unit = units_.at(u);
  if (unit.gathered) return;
  if (!unit.gathering) start_gather(u);
  unit.gathering->wait();
  unit.gathering.reset();
  unit.gathered = true;
  // END SOLUTION
}

// TODO(sharded_training-5): before unit u's part of forward runs. Gather it, and if this call is
// what gathered it (a unit used twice, like the GPT's embeddings, is still gathered at its second
// part), prefetch the unit forward reaches next, u + 1, so that its all-gather travels while u
// computes.
// Pitfall: a prefetch issued after the unit computes waits for that computation (on a GPU the
// communication stream starts a collective only after the work queued before it).
void FullyShardedModel::before_forward(size_t u) {
  // BEGIN SOLUTION
  if (units_.at(u).gathered) return;
  unshard(u);
  prefetch(u + 1);
  // END SOLUTION
}

// TODO(sharded_training-5): after unit u's part of forward. Let its whole parameters go
// (reshard), unless the unit is kept whole until its backward (unit.reshard_after_forward false).
// Pitfall: forgetting it keeps every layer whole until backward: DDP's memory, not ZeRO-3's.
void FullyShardedModel::after_forward(size_t u) {
  // BEGIN SOLUTION
  if (units_.at(u).reshard_after_forward) reshard(u);
  // END SOLUTION
}

// TODO(sharded_training-5): backward has reached unit u's output and is about to run the unit's
// backward, which needs its whole parameters again (autograd saved them, and their memory went
// at after_forward). Gather it, and if this call is what gathered it, prefetch the unit backward
// reaches next, u - 1 (for u > 0).
// Pitfall: without this, backward reads parameters that have no memory.
void FullyShardedModel::before_backward(size_t u) {
  // BEGIN SOLUTION
  if (units_.at(u).gathered) return;
  unshard(u);
  if (u > 0) prefetch(u - 1);
  // END SOLUTION
}

// TODO(sharded_training-5): autograd has accumulated every one of unit u's gradients into its
// parameters' .grad. Lay them out as the parameters are, in one whole gradient of padded_numel()
// elements (parameter i's at layout.offsets[i], zeros in the padding), hand it to
// reduce_scatter_gradient (it starts the reduce-scatter into grad_shard without waiting), then
// let the whole gradients go (each parameter's .grad reset) and the whole parameters (reshard).
// Pitfalls: a .grad left set makes the next backward add into it, and holds a whole unit's
// gradient between steps; under mixed precision the gradients are bf16: build the whole gradient
// in their dtype.
void FullyShardedModel::after_backward(size_t u) {
  // BEGIN SOLUTION
  Unit& unit = units_.at(u);
  torch::Tensor whole_gradient = torch::zeros({unit.layout.padded_numel()}, unit.params[0].grad().options());
  for (size_t i = 0; i < unit.params.size(); ++i) {
    auto& p = unit.params[i];
    whole_gradient.narrow(0, unit.layout.offsets[i], p.numel()).copy_(p.grad().reshape(-1));
    p.mutable_grad().reset();
  }
  reduce_scatter_gradient(u, whole_gradient);
  reshard(u);
  // END SOLUTION
}

// TODO(sharded_training-5): the step of ZeRO-3. For every unit: wait for its gradient's
// reduce-scatter (a unit without one got no gradient in this backward: an amplab::Error naming
// the unit), forget the Work, and adamw_shard_step on its shard with its grad_shard and moments
// (one step count for all units). Nothing to all-gather: the next forward gathers each unit
// when it needs it.
void FullyShardedModel::step() {
  // BEGIN SOLUTION
  ++steps_;
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = units_[u];
    if (!unit.reducing)
      throw amplab::Error("FullyShardedModel: unit " + std::to_string(u) + " got no gradient in this backward");
    unit.reducing->wait();
    unit.reducing.reset();
    adamw_shard_step(unit.shard, unit.grad_shard, unit.exp_avg, unit.exp_avg_sq, steps_, options_);
  }
  // END SOLUTION
}

}  // namespace zero_lab
