// A callback when autograd has accumulated a parameter's gradient: what data-parallel training
// (lab 5's overlapped and bucketed DDP) and sharded training (lab 8's ZeRO-2 and ZeRO-3) start their
// communication from, as PyTorch's Tensor.register_post_accumulate_grad_hook. Infrastructure: what
// the labs do when a gradient is ready is theirs.
#pragma once

#include <torch/csrc/autograd/function_hook.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <utility>

namespace amplab {

// Calls `ready()` each time autograd has accumulated a gradient into the parameter's .grad(): after
// the accumulation, so .grad holds this backward's final value. Backward produces the last layers'
// gradients first. It runs on autograd's thread (for CUDA tensors a thread of its own), while
// backward goes on.
class GradReadyHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  explicit GradReadyHook(std::function<void()> ready) : ready_(std::move(ready)) {}
  void operator()(const torch::autograd::Variable&) override { ready_(); }

 private:
  std::function<void()> ready_;
};

// One hook per parameter: setting one replaces any hook set before.
inline void set_grad_ready_hook(const torch::Tensor& param, std::function<void()> ready) {
  torch::autograd::impl::set_post_acc_grad_hooks(param, std::make_unique<GradReadyHook>(std::move(ready)));
}
inline void remove_grad_ready_hook(const torch::Tensor& param) {
  torch::autograd::impl::set_post_acc_grad_hooks(param, nullptr);
}
inline bool has_grad_ready_hook(const torch::Tensor& param) {
  return torch::autograd::impl::post_acc_grad_hooks(param) != nullptr;
}

}  // namespace amplab
