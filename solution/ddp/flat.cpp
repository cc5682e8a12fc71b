// Lab 5, step 2: one collective for all gradients. Each collective pays a latency besides its
// bytes (on NCCL's ring, one per step: 2(W-1) steps for W ranks; on the CPU backend, a store round
// trip); a model with hundreds of small parameters pays it hundreds of times in step 1. The price
// of one call is two copies of every gradient. See labs/ddp/README.md, "Step 2".
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>

#include "data_parallel.hpp"

namespace ddp_lab {

// TODO(ddp-6): the same result as step 1 (every .grad the average over the ranks; nothing while
// sync is off), with one all-reduce call per step: copy every gradient into one flat buffer,
// all-reduce it, copy the averages back into .grad.
// Pitfalls: one flat tensor has one dtype: parameters of different dtypes need a buffer each
// (one call can carry several tensors). A .grad may have another layout than a contiguous
// tensor (strides): copy through a view shaped like the parameter rather than reinterpreting
// memory. Unused parameters (undefined .grad) take part with zeros and get the average. The
// buffers can live from one step to the next (flat_): allocating a model-sized buffer every step
// costs memory traffic too.
void FlatDdp::finish() {
  // BEGIN SOLUTION
  if (!sync_enabled()) return;
  torch::NoGradGuard no_grad;
  // Parameters grouped by dtype, each group in registration order: one flat buffer per group.
  std::vector<std::vector<size_t>> groups;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto dtype = params_[i].tensor.scalar_type();
    auto group = std::find_if(groups.begin(), groups.end(),
                              [&](const auto& g) { return params_[g.front()].tensor.scalar_type() == dtype; });
    if (group == groups.end()) groups.push_back({i});
    else group->push_back(i);
  }
  if (flat_.size() != groups.size()) {
    flat_.clear();
    for (const auto& group : groups) {
      int64_t numel = 0;
      for (size_t i : group) numel += params_[i].tensor.numel();
      flat_.push_back(torch::empty({numel}, params_[group.front()].tensor.options().requires_grad(false)));
    }
  }
  // The slice of its group's buffer that holds params_[i]'s gradient, shaped like the parameter.
  auto for_each_slice = [&](const std::function<void(const torch::Tensor& param, torch::Tensor slice)>& fn) {
    for (size_t k = 0; k < groups.size(); ++k) {
      int64_t offset = 0;
      for (size_t i : groups[k]) {
        const torch::Tensor& p = params_[i].tensor;
        fn(p, flat_[k].narrow(0, offset, p.numel()).view(p.sizes()));
        offset += p.numel();
      }
    }
  };
  for_each_slice([](const torch::Tensor& p, torch::Tensor slice) {
    if (p.grad().defined()) slice.copy_(p.grad());
    else slice.zero_();
  });
  comm_->all_reduce_sum(flat_)->wait();
  for (auto& buffer : flat_) buffer.div_(comm_->size());
  for_each_slice([](const torch::Tensor& p, torch::Tensor slice) {
    torch::Tensor& grad = p.mutable_grad();
    if (grad.defined()) grad.copy_(slice);
    else grad = slice.clone();
  });
  // END SOLUTION
}

}  // namespace ddp_lab
