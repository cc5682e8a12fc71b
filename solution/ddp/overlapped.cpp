// Lab 5, step 3: communication overlapped with backward. Backward produces the last layer's
// gradients first; each one is final as soon as autograd has accumulated it into .grad, long
// before backward reaches the first layer. Starting its all-reduce right then hides the
// communication behind the rest of backward. See labs/ddp/README.md, "Step 3".
#include <torch/csrc/autograd/grad_mode.h>

#include "data_parallel.hpp"

namespace ddp_lab {

// TODO(ddp-7): overlapped synchronization, one all-reduce per gradient, each started by the hook
// of its parameter during backward (set_grad_ready_hook, in data_parallel.hpp).
// The constructor: decide the order in which every rank sends the gradients (order_: the order
// backward usually produces them, the reverse of registration), and hook every trainable
// parameter. A parameter that already has a hook belongs to another DDP: refuse it, naming it.
OverlappedDdp::OverlappedDdp(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<amplab::dist::Communicator> comm,
                             const amplab::dist::DistConfig& config)
    : DataParallel(std::move(module), std::move(comm), config) {
  // BEGIN SOLUTION
  for (size_t i = params_.size(); i-- > 0;) order_.push_back(i);
  ready_.assign(params_.size(), false);
  for (const auto& p : params_)
    if (has_grad_ready_hook(p.tensor))
      throw amplab::Error("DDP: parameter '" + p.name +
                          "' already has a post-accumulate-grad hook: is the model already wrapped by another DDP?");
  for (size_t i = 0; i < params_.size(); ++i) set_grad_ready_hook(params_[i].tensor, [this, i] { on_grad_ready(i); });
  // END SOLUTION
}

OverlappedDdp::~OverlappedDdp() {
  try {
    release();
  } catch (...) {
  }
}

// TODO(ddp-7): undo the constructor: remove every hook (the module may be trained alone or wrapped
// again after this object is gone, and a hook left behind would call into freed memory), and wait
// for any all-reduce still in flight (it writes into the gradients). Try to do all of it even when
// one part fails.
void OverlappedDdp::release() {
  // BEGIN SOLUTION
  for (const auto& p : params_) {
    try {
      remove_grad_ready_hook(p.tensor);
    } catch (...) {
    }
  }
  for (auto& work : in_flight_) {
    try {
      work->wait();
    } catch (...) {
    }
  }
  in_flight_.clear();
  // END SOLUTION
}

// TODO(ddp-7): the hook of params_[index]: its gradient of this backward is in .grad. Start the
// averaging all-reduce of every gradient that may go now, without waiting for it.
// Pitfalls:
// - Order. Collectives pair up by call order. Autograd's order of hooks is not the same on every
//   rank when ranks run different graphs (a branch only one rank takes), so send strictly in
//   order_: a gradient that arrives before the ones ahead of it waits until they are sent.
// - Accumulation. While sync is off the hook still fires (every backward accumulates): send
//   nothing then. And a second gradient for a parameter before finish() (two backwards, no
//   no_sync) would be sent twice: refuse it with an amplab::Error naming the parameter.
// - Threads. Hooks run on autograd's thread while finish() may run on yours: guard the shared
//   state (mutex_).
void OverlappedDdp::on_grad_ready(size_t index) {
  // BEGIN SOLUTION
  if (!sync_enabled()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (ready_[index])
    throw amplab::Error("DDP: parameter '" + params_[index].name +
                        "' got a second gradient before finish(): call backward once per step, and put accumulation "
                        "micro-steps under no_sync()");
  ready_[index] = true;
  while (next_ < order_.size() && ready_[order_[next_]]) {
    const torch::Tensor& p = params_[order_[next_++]].tensor;
    in_flight_.push_back(comm_->all_reduce_mean({p.grad()}));
  }
  // END SOLUTION
}

// TODO(ddp-7): after backward: send, in order_, the gradients backward did not (a parameter
// without a gradient in this backward sends what its .grad holds, accumulated under no_sync, or
// zeros when it has none), wait for every all-reduce of the step, and be ready for the next.
// Nothing while sync is off.
void OverlappedDdp::finish() {
  // BEGIN SOLUTION
  if (!sync_enabled()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  torch::NoGradGuard no_grad;
  for (; next_ < order_.size(); ++next_) {
    const torch::Tensor& p = params_[order_[next_]].tensor;
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    in_flight_.push_back(comm_->all_reduce_mean({p.grad()}));
  }
  for (auto& work : in_flight_) work->wait();
  in_flight_.clear();
  ready_.assign(params_.size(), false);
  next_ = 0;
  // END SOLUTION
}

}  // namespace ddp_lab
