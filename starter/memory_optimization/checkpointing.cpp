// Your copy of this lab's code: fill in every TODO(...) below; the tests tell you which one
// fails. (Instructors: generated from solution/ by scripts/make-starter.py; edit the solution.)
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
  AMPLAB_TODO("memory_optimization-4");
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
  AMPLAB_TODO("memory_optimization-4");
}

}  // namespace

// TODO(memory_optimization-4): the entry point. Without grad mode, or when neither the input nor
// any parameter requires grad, just run the segment: there is no graph to save memory in. Else
// put the segment and preserve_rng_state into a SegmentState (c10::make_intrusive) and apply the
// Function to the input followed by the parameters. An undefined input: an amplab::Error.
torch::Tensor checkpoint(const Segment& segment, const torch::Tensor& input, const std::vector<torch::Tensor>& parameters,
                         bool preserve_rng_state) {
  AMPLAB_TODO("memory_optimization-4");
}

}  // namespace memory_optimization
