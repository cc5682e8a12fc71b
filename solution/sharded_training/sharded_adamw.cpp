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
  // BEGIN SOLUTION
  torch::NoGradGuard no_grad;
  const auto& o = options;
  const double correction1 = 1 - std::pow(o.beta1, static_cast<double>(step));
  const double correction2 = 1 - std::pow(o.beta2, static_cast<double>(step));
  param_shard.mul_(1 - o.lr * o.weight_decay);
  exp_avg.mul_(o.beta1).add_(grad_shard, 1 - o.beta1);
  exp_avg_sq.mul_(o.beta2).addcmul_(grad_shard, grad_shard, 1 - o.beta2);
  torch::Tensor denom = (exp_avg_sq.sqrt() / std::sqrt(correction2)).add_(o.eps);
  param_shard.addcdiv_(exp_avg, denom, -o.lr / correction1);
  // END SOLUTION
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
  // BEGIN SOLUTION
  comm_->reduce_scatter(grad_shard_, flat_grads_, amplab::dist::Reduction::mean)->wait();
  ++steps_;
  torch::Tensor shard = flat_params_.narrow(0, layout_.shard_begin(comm_->rank()), layout_.shard_numel);
  adamw_shard_step(shard, grad_shard_, exp_avg_, exp_avg_sq_, steps_, options_);
  comm_->all_gather(flat_params_, shard)->wait();
  // END SOLUTION
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
  // BEGIN SOLUTION
  std::lock_guard<std::mutex> lock(mutex_);
  Bucket& b = buckets_.at(bucket);
  if (b.pending == 0) throw amplab::Error("bucket " + std::to_string(bucket) + ": a gradient arrived twice in one backward");
  if (--b.pending > 0) return;
  torch::NoGradGuard no_grad;
  torch::Tensor flat = torch::zeros({b.layout.padded_numel()}, b.flat_params.options());
  for (size_t i = 0; i < b.params.size(); ++i) {
    auto& p = b.params[i];
    flat.narrow(0, b.layout.offsets[i], p.numel()).copy_(p.grad().reshape(-1));
    p.mutable_grad().reset();
  }
  b.reduce_scatter = comm_->reduce_scatter(b.grad_shard, flat, amplab::dist::Reduction::mean);
  // END SOLUTION
}

// TODO(sharded_training-4): the step after backward: ZeRO-1's step, bucket by bucket, each bucket's
// shard stepped with its own mean gradient shard and moments and then gathered, one step count for
// all buckets. A bucket whose reduce-scatter never started had a parameter that got no gradient:
// an amplab::Error naming the bucket, not a wait. Afterwards every bucket is ready for the next
// backward.
// Pitfalls: the same as ShardedAdamW::step's; and a bucket's shard is rank * its own shard_numel
// into its own flat_params: each bucket is cut on its own.
void ShardedGradientsAdamW::step() {
  // BEGIN SOLUTION
  ++steps_;
  const int rank = comm_->rank();
  std::vector<std::shared_ptr<amplab::dist::Work>> gathers;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    if (!b.reduce_scatter)
      throw amplab::Error("ShardedGradientsAdamW: bucket " + std::to_string(i) + " got " +
                          std::to_string(b.params.size() - b.pending) + " of its " + std::to_string(b.params.size()) +
                          " gradients in this backward: every parameter must get one");
    b.reduce_scatter->wait();
    b.reduce_scatter.reset();
    b.pending = b.params.size();
    torch::Tensor shard = b.flat_params.narrow(0, b.layout.shard_begin(rank), b.layout.shard_numel);
    adamw_shard_step(shard, b.grad_shard, b.exp_avg, b.exp_avg_sq, steps_, options_);
    gathers.push_back(comm_->all_gather(b.flat_params, shard));
  }
  for (auto& g : gathers) g->wait();
  // END SOLUTION
}

}  // namespace zero_lab
