// Lab 8: ZeRO-1's step. See labs/sharded_training/README.md, "The sharded step".
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>

#include "sharded_training.hpp"

namespace zero_lab {

// TODO(sharded_training-2): one step of AdamW on this rank's shard, ZeRO-1's way. Backward has left every
// rank's own gradients in flat_grads_ (the .grad views). Three moves:
//  1. reduce-scatter flat_grads_ into grad_shard_, averaged over the ranks: rank r receives the
//     mean of every rank's elements [r * shard_numel, (r + 1) * shard_numel) (grad_shard_ is that
//     slice of flat_grads_ itself: the Communicator reduce-scatters in place);
//  2. AdamW (decoupled weight decay, as torch.optim.AdamW) on this rank's shard of flat_params_,
//     with moments exp_avg_ and exp_avg_sq_ and step count steps_ (1 at the first step):
//       p <- p * (1 - lr * weight_decay)
//       m <- beta1 * m + (1 - beta1) * g          v <- beta2 * v + (1 - beta2) * g * g
//       p <- p - lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
//  3. all-gather the shards so that every rank's flat_params_ (and so every parameter, a view
//     of it) holds every rank's updated shard.
// The collectives are asynchronous (wait() on what they return before reading their output).
// Pitfalls: a sum over W ranks is W times the mean, and Adam hides the factor in the update (m /
// sqrt(v) does not change when g is scaled) but the gradient itself is wrong (clipping, logging
// and eps see it); a shard that starts at rank * shard_numel must be a view of flat_params_ (a
// copy is updated and then lost); no autograd history while the step writes into parameters.
void ShardedAdamW::step() {
  // BEGIN SOLUTION
  torch::NoGradGuard no_grad;
  comm_->reduce_scatter(grad_shard_, flat_grads_, amplab::dist::Reduction::mean)->wait();
  ++steps_;
  const auto& o = options_;
  const double correction1 = 1 - std::pow(o.beta1, static_cast<double>(steps_));
  const double correction2 = 1 - std::pow(o.beta2, static_cast<double>(steps_));
  torch::Tensor shard = flat_params_.narrow(0, layout_.shard_begin(comm_->rank()), layout_.shard_numel);
  shard.mul_(1 - o.lr * o.weight_decay);
  exp_avg_.mul_(o.beta1).add_(grad_shard_, 1 - o.beta1);
  exp_avg_sq_.mul_(o.beta2).addcmul_(grad_shard_, grad_shard_, 1 - o.beta2);
  torch::Tensor denom = (exp_avg_sq_.sqrt() / std::sqrt(correction2)).add_(o.eps);
  shard.addcdiv_(exp_avg_, denom, -o.lr / correction1);
  comm_->all_gather(flat_params_, shard)->wait();
  // END SOLUTION
}

}  // namespace zero_lab
