// Lab 8: ZeRO-3 (FSDP), a unit's four moments and the step. See labs/sharded_training/README.md,
// "ZeRO-3: parameters gathered when they are used".
#include <torch/torch.h>

#include "amplab/infra/error.hpp"
#include "sharded_training.hpp"

namespace zero_lab {

// TODO(sharded_training-5): a prefetch: unit u's all-gather started, and the call returns at once,
// so that the gather travels while something else computes. Asking for a unit that does not
// exist (past either end), one already whole or already on its way, or any prefetch while
// prefetching is off (prefetch_), does nothing.
// Pitfall: gathering a unit twice gives its whole buffer memory twice (the given start_gather
// refuses).
void FullyShardedModel::prefetch(size_t u) {
  // BEGIN SOLUTION
  if (!prefetch_ || u >= units_.size()) return;
  const Unit& unit = units_[u];
  if (unit.gathered || unit.gathering) return;
  start_gather(u);
  // END SOLUTION
}

// TODO(sharded_training-5): afterwards unit u is whole and safe to compute with, whether its gather
// was prefetched, is still on its way, or was never started. The unit's flags (sharded_training.hpp,
// Unit) must say so, because run_unit checks them.
// Pitfall: a gather nobody waited for: the layer would compute on memory the all-gather is still
// writing (on a GPU, waiting makes the compute stream wait, not the host).
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

// TODO(sharded_training-5): the moment before unit u's part of forward. Contract: u is whole when its
// part runs, and the unit forward reaches next is already travelling while u computes. A unit
// used twice in one forward (the GPT's embeddings) is still whole at its second part: that call
// has nothing to start.
// Pitfall: a prefetch issued after the unit computes waits for that computation (on a GPU the
// communication stream starts a collective only after the work queued before it), and the
// tests count the matrix products run before each collective.
void FullyShardedModel::before_forward(size_t u) {
  // BEGIN SOLUTION
  if (units_.at(u).gathered) return;
  unshard(u);
  prefetch(u + 1);
  // END SOLUTION
}

// TODO(sharded_training-5): the moment after unit u's part of forward: its whole parameters give
// their memory back, unless the unit is one that stays whole until its backward
// (unit.reshard_after_forward).
// Pitfall: forgetting it keeps every layer whole until backward: DDP's memory, not ZeRO-3's.
void FullyShardedModel::after_forward(size_t u) {
  // BEGIN SOLUTION
  if (units_.at(u).reshard_after_forward) reshard(u);
  // END SOLUTION
}

// TODO(sharded_training-5): backward has reached unit u's output and is about to run the unit's
// backward, which reads its whole parameters again (autograd saved views of them, and their memory
// went at after_forward). Contract: u whole when its backward runs, and the unit backward reaches
// next (the one before it) already travelling.
// Pitfall: without this, backward reads parameters that hold no bytes (run_unit refuses).
void FullyShardedModel::before_backward(size_t u) {
  // BEGIN SOLUTION
  if (units_.at(u).gathered) return;
  unshard(u);
  if (u > 0) prefetch(u - 1);
  // END SOLUTION
}

// TODO(sharded_training-5): autograd has accumulated every one of unit u's gradients. Contract:
// afterwards the unit's mean gradient is on its way to this rank's grad_shard (the given
// reduce_scatter_gradient starts it, from one whole gradient laid out exactly as the unit's flat
// parameters are, padding zero), and nothing of the unit is whole any more: neither its
// parameters nor its parameters' gradients.
// Pitfalls: a .grad left set makes the next backward add into it and keeps a whole unit's gradient
// between steps; under mixed precision the gradients are bf16: build the whole gradient in their
// dtype.
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

// TODO(sharded_training-5): ZeRO-3's step: every unit's shard takes one AdamW step
// (adamw_shard_step) with its mean gradient shard, once that has arrived, one step count for all
// units. A unit whose gradient never started this backward is an amplab::Error naming the unit,
// not a wait. Nothing needs gathering afterwards: the next forward gathers each unit when it
// needs it.
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
