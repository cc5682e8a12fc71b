// Lab 3: activation checkpointing (TODO 4), from the autograd side. C++ has no
// torch.utils.checkpoint (pytorch/pytorch#52744): here it is, as a custom autograd Function.
// See labs/memory_optimization/README.md for the idea and what it trades.
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <torch/csrc/autograd/autograd.h>         // torch::autograd::grad
#include <torch/csrc/autograd/custom_function.h>  // torch::autograd::Function

#include <algorithm>
#include <mutex>
#include <optional>

#include "amplab/infra/error.hpp"
#include "amplab/train/precision.hpp"
#include "memory_optimization.hpp"

namespace memory_optimization {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Given: the state of torch's random generator of `device` (the CPU's, or one GPU's), read and set.
torch::Tensor generator_state(c10::Device device) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}
void set_generator_state(c10::Device device, const torch::Tensor& state) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// Given: what backward needs besides the tensors the context saves.
struct SegmentState : torch::CustomClassHolder {
  Segment segment;
  bool preserve_rng = true;
  torch::Tensor cpu_rng;                                             // the CPU generator before the forward
  std::vector<std::pair<c10::DeviceIndex, torch::Tensor>> cuda_rng;  // each GPU's the tensors live on
  bool cpu_autocast = false;                                         // autocast as the forward saw it
  c10::ScalarType cpu_autocast_dtype = c10::kBFloat16;
  bool cuda_autocast = false;
  c10::ScalarType cuda_autocast_dtype = c10::kHalf;
};

// The Function's tensors are the segment's input, then its parameters: parameters used inside the
// segment are no inputs of it, but a custom Function only returns gradients for its inputs, so
// they are passed as inputs too. Then the autograd engine accumulates their gradients into .grad
// through their own AccumulateGrad nodes, exactly as without checkpointing (hooks on .grad fire,
// torch::autograd::grad from outside works, gradients add up across micro-batches).
class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, at::TensorList tensors, c10::intrusive_ptr<SegmentState> state);
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs);
};

// TODO(memory_optimization-4): forward. Record in `state` what the recomputation must see again:
// the random generators' states before the segment runs (the CPU's, and each GPU's that the
// tensors live on; only when state->preserve_rng) and autocast's state (enabled and dtype, for
// the CPU and for CUDA). Run the segment on the input (tensors[0]) without building a graph
// (autograd already runs a Function's forward in no-grad mode: that is what saves the memory),
// save every tensor for backward (the input is the only activation kept), put the state into
// ctx->saved_data, and return the output.
// Pitfall: an undefined output is an error worth a clear message (amplab::Error).
variable_list CheckpointFunction::forward(AutogradContext* ctx, at::TensorList tensors,
                                          c10::intrusive_ptr<SegmentState> state) {
  // BEGIN SOLUTION
  if (state->preserve_rng) {
    state->cpu_rng = generator_state(c10::Device(c10::kCPU));
    std::vector<c10::DeviceIndex> gpus;
    for (const auto& t : tensors)
      if (t.is_cuda() && std::find(gpus.begin(), gpus.end(), t.device().index()) == gpus.end())
        gpus.push_back(t.device().index());
    for (auto index : gpus) state->cuda_rng.emplace_back(index, generator_state(c10::Device(c10::kCUDA, index)));
  }
  state->cpu_autocast = at::autocast::is_autocast_enabled(c10::kCPU);
  state->cpu_autocast_dtype = at::autocast::get_autocast_dtype(c10::kCPU);
  state->cuda_autocast = at::autocast::is_autocast_enabled(c10::kCUDA);
  state->cuda_autocast_dtype = at::autocast::get_autocast_dtype(c10::kCUDA);
  torch::Tensor output;
  {
    torch::NoGradGuard no_grad;
    output = state->segment(tensors[0]);
  }
  if (!output.defined()) throw amplab::Error("checkpoint: the segment returned an undefined tensor");
  ctx->save_for_backward(variable_list(tensors.begin(), tensors.end()));
  ctx->saved_data["state"] = c10::IValue::make_capsule(state);
  return {output};
  // END SOLUTION
}

// TODO(memory_optimization-4): backward. Rerun the segment, this time building its graph, on a
// fresh leaf copy of the saved input that requires grad (gradients stop there and are returned),
// under the forward's random numbers (set the recorded generator states, run, then put back the
// states backward found, so the random stream goes on as without checkpointing) and the forward's
// autocast state (amplab::AutocastGuard for each device type). Then ask torch::autograd::grad for
// the gradients of the recomputed output, with grad_outputs[0], with respect to the input copy and
// the parameters that require grad (allow_unused: a parameter the segment did not use gets none),
// and return one gradient per Function input, in order (input, then parameters), plus an
// undefined one for the state argument.
// Pitfalls: without the generator replay dropout draws new masks and the gradients are wrong
// (the tests have dropout); calling backward() here instead of autograd::grad would write .grad
// behind the engine's back.
variable_list CheckpointFunction::backward(AutogradContext* ctx, variable_list grad_outputs) {
  // BEGIN SOLUTION
  auto state = c10::static_intrusive_pointer_cast<SegmentState>(ctx->saved_data["state"].toCapsule());
  const variable_list saved = ctx->get_saved_variables();
  variable_list result(saved.size() + 1);  // a gradient per tensor, none for the state
  if (!grad_outputs[0].defined()) return result;

  torch::Tensor input = saved[0].detach().requires_grad_(saved[0].requires_grad());
  std::vector<torch::Tensor> targets;
  std::vector<size_t> target_index;  // position of each target among the Function's tensors
  if (input.requires_grad() && ctx->needs_input_grad(0)) {
    targets.push_back(input);
    target_index.push_back(0);
  }
  for (size_t i = 1; i < saved.size(); ++i) {
    if (saved[i].requires_grad() && ctx->needs_input_grad(i)) {
      targets.push_back(saved[i]);
      target_index.push_back(i);
    }
  }

  torch::Tensor output;
  {
    torch::Tensor outside_cpu_rng;  // the states backward found, put back afterwards
    std::vector<std::pair<c10::DeviceIndex, torch::Tensor>> outside_cuda_rng;
    if (state->preserve_rng) {
      outside_cpu_rng = generator_state(c10::Device(c10::kCPU));
      for (const auto& [index, s] : state->cuda_rng)
        outside_cuda_rng.emplace_back(index, generator_state(c10::Device(c10::kCUDA, index)));
      set_generator_state(c10::Device(c10::kCPU), state->cpu_rng);
      for (const auto& [index, s] : state->cuda_rng) set_generator_state(c10::Device(c10::kCUDA, index), s);
    }
    {
      amplab::AutocastGuard cpu(c10::kCPU, state->cpu_autocast_dtype, state->cpu_autocast);
      amplab::AutocastGuard cuda(c10::kCUDA, state->cuda_autocast_dtype, state->cuda_autocast);
      torch::AutoGradMode grad_mode(true);
      output = state->segment(input);
    }
    if (state->preserve_rng) {
      set_generator_state(c10::Device(c10::kCPU), outside_cpu_rng);
      for (const auto& [index, s] : outside_cuda_rng) set_generator_state(c10::Device(c10::kCUDA, index), s);
    }
  }
  if (targets.empty() || !output.requires_grad()) return result;
  variable_list grads = torch::autograd::grad({output}, targets, {grad_outputs[0]}, /*retain_graph=*/false,
                                              /*create_graph=*/false, /*allow_unused=*/true);
  for (size_t k = 0; k < targets.size(); ++k) result[target_index[k]] = grads[k];
  return result;
  // END SOLUTION
}

}  // namespace

// TODO(memory_optimization-4): the entry point. Without grad mode, or when neither the input nor
// any parameter requires grad, just run the segment: there is no graph to save memory in. Else
// put the segment and preserve_rng_state into a SegmentState (c10::make_intrusive) and apply the
// Function to the input followed by the parameters. An undefined input: an amplab::Error.
torch::Tensor checkpoint(const Segment& segment, const torch::Tensor& input, const std::vector<torch::Tensor>& parameters,
                         bool preserve_rng_state) {
  // BEGIN SOLUTION
  if (!input.defined()) throw amplab::Error("checkpoint: the input is undefined");
  std::vector<torch::Tensor> tensors{input};
  bool any_requires_grad = input.requires_grad();
  for (const auto& p : parameters) {
    if (!p.defined()) continue;
    any_requires_grad = any_requires_grad || p.requires_grad();
    tensors.push_back(p);
  }
  if (!torch::GradMode::is_enabled() || !any_requires_grad) return segment(input);
  auto state = c10::make_intrusive<SegmentState>();
  state->segment = segment;
  state->preserve_rng = preserve_rng_state;
  return CheckpointFunction::apply(at::TensorList(tensors), state)[0];
  // END SOLUTION
}

}  // namespace memory_optimization
