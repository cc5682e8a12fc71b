// Your copy of this lab's code: fill in every TODO(...) below; the tests tell you which one
// fails. (Instructors: generated from solution/ by scripts/make-starter.py; edit the solution.)
// Lab 8: the sharded steps of ZeRO-1 and ZeRO-2. See labs/sharded_training/README.md, "The sharded
// step" and "ZeRO-2: gradients sharded as backward makes them".
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>

#include "amplab/infra/error.hpp"
#include "sharded_training.hpp"

namespace zero_lab {

// TODO(sharded_training-2): AdamW on one shard, in place: the update of torch.optim.AdamW (decoupled
// weight decay, bias-corrected moments; the README's "The sharded step" writes it out), with the
// shard's gradient, its two moments and the step count t (1 at the first step). The tests compare
// with torch's AdamW to rounding.
// Pitfalls: every update must write into the tensors themselves, since param_shard is a view of
// the flat parameters (a new tensor is updated and then lost); t = 0 divides by zero in the bias
// correction; no autograd history while the step writes into parameters.
void adamw_shard_step(torch::Tensor& param_shard, const torch::Tensor& grad_shard, torch::Tensor& exp_avg,
                      torch::Tensor& exp_avg_sq, int64_t step, const AdamWOptions& options) {
  AMPLAB_TODO("sharded_training-2");
}

// TODO(sharded_training-2): one step of AdamW, ZeRO-1's way (README, "The sharded step"). Backward has
// left every rank's own gradients in flat_grads_ (the .grad views). Contract: afterwards every
// rank's flat_params_ (and so every parameter, a view of it) holds what one AdamW step on the mean
// gradient gives, while this rank has computed the update of its own shard only, with its own
// moments (grad_shard_ is this rank's slice of flat_grads_: the Communicator's reduce-scatter
// works in place). The collectives are asynchronous: wait for a result before reading it.
// Pitfalls: a sum over W ranks is W times the mean, and Adam hides the factor in the update (m /
// sqrt(v) does not change when g is scaled) but the gradient itself is wrong (clipping, logging
// and eps see it); a shard that starts at rank * shard_numel must be a view of flat_params_ (a
// copy is updated and then lost).
void ShardedAdamW::step() {
  AMPLAB_TODO("sharded_training-2");
}

// TODO(sharded_training-4): a gradient of bucket `bucket` is ready (README, "ZeRO-2"). Contract: once
// the bucket's last gradient is in, its mean gradient is on its way to the bucket's grad_shard
// (reduce-scattered from one buffer laid out as the bucket's flat_params is, padding zero), the
// bucket remembers the collective for step(), and no parameter of the bucket holds a whole
// gradient any more: between steps a rank keeps only its shards. Before that, a call only counts.
// Do not wait here: backward is still running on this thread, and the point is that the
// collective travels while backward computes the layers before this one. The Communicator keeps
// its input alive until the collective is done.
// Pitfalls: the hooks may run on autograd's threads, so take mutex_; pending counts down from
// the bucket's number of parameters and must be reset for the next backward; .grad of a
// parameter is the tensor autograd accumulated into, not a view of anything of yours.
void ShardedGradientsAdamW::gradient_ready(size_t bucket) {
  AMPLAB_TODO("sharded_training-4");
}

// TODO(sharded_training-4): the step after backward: ZeRO-1's step, bucket by bucket, each bucket's
// shard stepped with its own mean gradient shard and moments and then gathered, one step count for
// all buckets. A bucket whose reduce-scatter never started had a parameter that got no gradient:
// an amplab::Error naming the bucket, not a wait. Afterwards every bucket is ready for the next
// backward.
// Pitfalls: the same as ShardedAdamW::step's; and a bucket's shard is rank * its own shard_numel
// into its own flat_params: each bucket is cut on its own.
void ShardedGradientsAdamW::step() {
  AMPLAB_TODO("sharded_training-4");
}

}  // namespace zero_lab
