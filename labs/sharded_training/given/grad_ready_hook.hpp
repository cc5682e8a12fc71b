// The hook ZeRO-2's and ZeRO-3's given code put on each parameter: it calls back once autograd
// has accumulated the parameter's gradient into .grad (PyTorch's
// Tensor.register_post_accumulate_grad_hook).
#pragma once

#include <torch/csrc/autograd/function_hook.h>

#include <functional>
#include <utility>

namespace zero_lab {

class GradReadyHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  explicit GradReadyHook(std::function<void()> ready) : ready_(std::move(ready)) {}
  void operator()(const torch::autograd::Variable&) override { ready_(); }

 private:
  std::function<void()> ready_;
};

}  // namespace zero_lab
