// A ReLU MLP with its matrix products in FP8, as the fast path runs it:
//   Fp8ReluMlp mlp;                      // holds the scaling state, one per MLP
//   y = mlp.forward(x, weights);         // relu(... relu(relu(x w0^T) w1^T) ...), bfloat16
// Each layer is Lab 7's FP8 linear (e4m3 activations and weights, e5m2 gradients, three
// at::_scaled_mm a layer) with what a textbook layer leaves on the table taken back:
//   - delayed scaling for all three tensors of a layer: a cast's scale comes from the largest
//     amax of the past `history` steps, and the cast itself records this step's amax (no pass of
//     its own over the tensor). The first call scales from the tensors' own amaxes, as torchao's
//     delayed scaling did, so that the first step's gradients do not underflow;
//   - each cast one pass that also writes the transpose backward takes;
//   - the ReLU folded into the next layer's input cast (its bf16 output is never written), and
//     the ReLU's backward into the gradient's cast;
//   - one kernel a step turns all the amaxes into scales;
//   - the forward's product with fast accumulation, as torchao's forward (on Hopper through the
//     rowwise kernel, which ran faster there); the gradients' products accumulate in full.
// On a GPU our kernels do the casts (src/amplab/fast/cuda/fp8_cast_kernels.hpp); off it, or for
// shapes they do not take, PyTorch's ops compute the same values (the tests hold the two equal).
#pragma once

#include <torch/types.h>

#include <vector>

namespace amplab {

class Fp8ReluMlp {
 public:
  // kernels = false: PyTorch's ops everywhere (the tests' reference on a GPU).
  explicit Fp8ReluMlp(int64_t history = 16, bool kernels = true);

  // x: (N, in) float32 or bfloat16 (taken to bfloat16, as autocast would); weights[i]: (out_i, in_i)
  // float32, each layer's input its predecessor's output. Sizes multiples of 16 (the FP8 matmul's
  // rule). Returns relu of the last layer's output, (N, out) in bfloat16. Gradients flow to x and
  // the weights as they require.
  torch::Tensor forward(const torch::Tensor& x, const std::vector<torch::Tensor>& weights);

  // This step's scales, (3 * layers, 2) float32: per layer the input's, the weight's and the
  // output gradient's {scale, 1 / scale}; defined after the first forward.
  torch::Tensor scales() const { return state_.scales.defined() ? state_.scales.select(2, 0) : torch::Tensor(); }

  // The tensors a forward and its backward share (internal to the fast path).
  struct State {
    torch::Tensor history;  // (states, length) float32: past amaxes, a ring per state
    torch::Tensor pending;  // (states) float32: this step's amaxes, raised by the casts
    torch::Tensor next;     // (1) int32: the ring slot the next step's amaxes go to
    torch::Tensor limits;   // (states) float32: the largest finite value of each state's format
    torch::Tensor scales;   // (states, 2, 4) float32: [s][0][0] the scale, [s][1][0] its inverse
    bool primed = false;    // scales have come from amaxes once
    bool fused = false;     // the casts run our kernels
  };

 private:
  int64_t history_;
  bool kernels_;
  State state_;
};

}  // namespace amplab
