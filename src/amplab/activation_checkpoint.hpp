// Activation checkpointing for LibTorch (C++ has no torch.utils.checkpoint: pytorch/pytorch#52744).
//
// A checkpointed segment keeps only its inputs for backward, not the activations inside it. Its
// forward runs without building a graph; when backward reaches it, the segment runs again with grad
// enabled, under the random-number state and the autocast state its forward saw (so dropout draws
// the same masks and matmuls run in the same dtype), and the gradients flow on from there. Memory
// for activations falls from "every tensor of every layer" to "the segment inputs plus one
// segment's activations"; the price is one more forward pass of every checkpointed segment.
//
// How the gradients of parameters get to .grad. A custom autograd Function only returns
// gradients for its *inputs*; parameters used inside the segment are not inputs, so the segment's
// parameters are passed to the Function as extra inputs. Backward recomputes the segment and asks
// torch::autograd::grad for the gradients of the (detached) segment inputs and of those
// parameters, without accumulating anything itself, and returns them all: the autograd engine then
// accumulates the parameter gradients into .grad through the parameters' own AccumulateGrad nodes,
// exactly as without checkpointing. So hooks on .grad (DDP's post-accumulate hooks) fire as usual,
// torch::autograd::grad(loss, parameters) from outside works, and .grad accumulates across
// micro-batches. (The alternative, calling backward() inside and returning only input gradients,
// writes .grad behind the engine's back: autograd::grad from outside would then silently fill .grad
// and return nothing for the parameters.) Consequence: every parameter the segment uses must be in
// the list given to checkpoint(); one that is missing gets no gradient. checkpoint_module() and
// checkpoint_sequential() pass a module's parameters themselves.
//
// Limits, as with PyTorch's reentrant checkpoint: no double backward (create_graph); buffers
// updated in forward (BatchNorm's running statistics) are updated again by the recomputation;
// inputs must not be modified in place between forward and backward (an error says so).
#pragma once

#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include <functional>
#include <vector>

namespace amplab {

struct CheckpointOptions {
  // Replay the forward's random numbers in the recomputation: saves torch's CPU generator state and
  // the CUDA generator state of every GPU the inputs and parameters live on before the forward,
  // and restores them around the recomputation (then puts back the state backward found, so the
  // random stream after backward is the same as without checkpointing). Off: dropout draws new
  // masks in the recomputation and the gradients are wrong.
  bool preserve_rng_state = true;
};

// A segment: tensors in, tensors out (floating point).
using SegmentFn = std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)>;

// Runs `segment` on `inputs` without keeping its activations; `parameters` are every tensor
// requiring grad that the segment uses besides its inputs. Without grad mode, or when nothing
// requires grad, the segment just runs.
std::vector<torch::Tensor> checkpoint_tensors(const SegmentFn& segment, const std::vector<torch::Tensor>& inputs,
                                              const std::vector<torch::Tensor>& parameters,
                                              const CheckpointOptions& options = {});

// One tensor in, one out.
torch::Tensor checkpoint(const std::function<torch::Tensor(const torch::Tensor&)>& segment, const torch::Tensor& input,
                         const std::vector<torch::Tensor>& parameters, const CheckpointOptions& options = {});

// A module with forward(Tensor) -> Tensor (a ModuleHolder such as torch::nn::Linear, or a
// std::shared_ptr to a module); its parameters are routed for it.
template <class ModulePtr>
torch::Tensor checkpoint_module(const ModulePtr& module, const torch::Tensor& input, const CheckpointOptions& options = {}) {
  return checkpoint([m = module](const torch::Tensor& x) mutable { return m->forward(x); }, input, module->parameters(),
                    options);
}

// Runs `sequential` on `input`, keeping activations only at every `every`-th block boundary: the
// blocks are cut into segments of `every` consecutive blocks and each segment but the last runs
// checkpointed. The last one runs normally, since its backward comes first and recomputing it would
// save nothing (PyTorch's checkpoint_sequential does the same). every = 1: each block's input is
// kept; every <= 0 or every >= size(): nothing is checkpointed.
torch::Tensor checkpoint_sequential(const torch::nn::Sequential& sequential, const torch::Tensor& input, int64_t every = 1,
                                    const CheckpointOptions& options = {});

}  // namespace amplab
