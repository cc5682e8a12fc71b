// Your copy of this lab's code: fill in every TODO(...) below; the tests tell you which one
// fails. (Instructors: generated from solution/ by scripts/make-starter.py; edit the solution.)
// Lab 7, transformers in low precision and FP8: attention, FP8 scaling, an FP8 linear layer and
// delayed scaling. Each TODO is one function (or the two halves of the FP8 autograd function);
// see labs/transformer_fp8/README.md for the theory.
#include "transformer_fp8.hpp"

#include <ATen/ops/_scaled_mm.h>

#include <cmath>
#include <limits>
#include <string>

#include "amplab/infra/error.hpp"

namespace transformer_fp8 {

// TODO(transformer_fp8-1): scores = q k^T / sqrt(D), shape (B, H, T, T); positions above the
// diagonal (key after query) masked out so that softmax gives them weight 0; softmax over the
// keys; torch::dropout on those weights when training (the same call, on the same tensor, as
// PyTorch's math path: then one seed gives both the same dropout mask); then the weighted sum
// of v. Pitfalls: the mask must be causal (lower triangle kept), not its transpose; the softmax
// runs over the last dimension (keys), not over the queries; dropout's surviving weights are
// scaled by 1/(1-p) (torch::dropout does it), and nothing is dropped in eval.
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double dropout_p,
                               bool training) {
  AMPLAB_TODO("transformer_fp8-1");
}

// TODO(transformer_fp8-2): the attention of TODO 1 made safe for fp16, where two things break:
//  1. the raw scores: with |q||k| beyond 65504 (fp16's largest value) q k^T overflows to inf
//     although the scores divided by sqrt(D) would fit. Scale before the matmul (q and k each
//     by D^-1/4, as PyTorch's math path does, or q by D^-1/2), or compute the scores in fp32.
//  2. the mask: a row with no allowed key is all -inf, and softmax of it is 0/0 = NaN, which
//     then spreads through every later layer. Compute the softmax in fp32 (exp of large fp16
//     differences loses everything), use a finite fill value or mask the weights after, and
//     give a fully masked row zero weights (its output is zeros).
// Pitfalls: a finite fill alone gives a fully masked row uniform weights (the mean of v, not
// zeros); cast the weights back to v's dtype before the last matmul.
torch::Tensor safe_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& allowed, double dropout_p, bool training) {
  AMPLAB_TODO("transformer_fp8-2");
}

// TODO(transformer_fp8-3): abs_max: max |x| as a 0-dim float32 tensor.
// Pitfall: no .item(): the value stays on the device.
torch::Tensor abs_max(const torch::Tensor& x) {
  AMPLAB_TODO("transformer_fp8-3");
}

// TODO(transformer_fp8-3): the tensorwise scale, a 0-dim float32 tensor: the factor that maps the
// tensor's largest magnitude (amax) onto the format's largest value (README, "FP8: formats and
// scaling recipes"), so that the cast uses the whole range. An all-zero tensor (amax 0) must still
// get a finite scale: the header's kAmaxFloor is the smallest amax a scale is made from.
// Pitfall: the inverse is the *dequantization* factor, what the matmul multiplies by afterwards.
torch::Tensor scale_from_amax(const torch::Tensor& amax, Fp8Format format) {
  AMPLAB_TODO("transformer_fp8-3");
}

// TODO(transformer_fp8-3): the saturated cast: x times its scale, in the FP8 format, where a value
// beyond the format's range becomes the largest finite value of its sign (PyTorch's bytes: the
// tests compare them one by one). Pitfalls: the product's dtype: a bf16 x times a 0-dim float32
// scale stays bf16 by torch's promotion rules and rounds twice; and a plain cast of a value beyond
// the range gives NaN in e4m3 (it has no infinity) and inf in e5m2: saturating is yours to do.
torch::Tensor to_fp8(const torch::Tensor& x, const torch::Tensor& scale, Fp8Format format) {
  AMPLAB_TODO("transformer_fp8-3");
}

namespace {

// The FP8 linear layer as an autograd function: forward and backward are yours (TODO 4).
class Fp8LinearFunction : public torch::autograd::Function<Fp8LinearFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& x_scale, const torch::Tensor& w_scale);
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grad_outputs);
};

// TODO(transformer_fp8-4): forward: y = x w^T, in x's dtype, computed by torch's FP8 matmul
// (at::_scaled_mm) on x and the weight cast to e4m3 at the scales given. The header's
// cast_to_fp8_with_transpose gives a cast and its transpose together (your to_fp8 and a copy, or
// your TODO 7 kernel on a GPU once it is done). Save for backward what its two matmuls will read,
// in the bytes they read it: FP8 operands are half of bf16's, which is part of what FP8 saves.
// Contract of _scaled_mm (torch 2.11): mat1 row-major, mat2 column-major (on a GPU; the CPU
// accepts either), and the .t() of a row-major tensor is column-major; sizes multiples of 16 on
// a GPU; its two scales are the *dequantization* factors (0-dim float32: the inverse of the
// cast's scale), which the matmul multiplies its fp32 accumulator by.
torch::Tensor Fp8LinearFunction::forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                         const torch::Tensor& weight, const torch::Tensor& x_scale,
                                         const torch::Tensor& w_scale) {
  AMPLAB_TODO("transformer_fp8-4");
}

// TODO(transformer_fp8-4): backward. Given g = dL/dy (N, out), return dL/dx (N, in) in x's dtype
// and dL/dw (out, in), accumulated in fp32 and then in the weight's dtype. Derive both first
// (README, "The linear's backward, derived"): write y = x w^T element by element, apply the chain
// rule, and read each sum as a matmul of two of g, x and w. The shapes leave one way to write
// each. Then run both matmuls on _scaled_mm, with g cast to e5m2 at a dynamic scale of its own
// (the header's amax_for_cast, then your TODO 3: gradients need e5m2's range more than e4m3's
// precision). For each operand, pick the layout that forward saved or the one the gradient's cast
// made. Return one gradient per forward input, in order; the scales get none.
// Pitfalls: e5m2 x e5m2 is not an FP8 matmul the GPU has; e5m2 x e4m3 is. Compute only the
// gradients autograd asks for (ctx->needs_input_grad(i), an undefined tensor for the others): a
// network's first layer gets an input that needs no gradient, and its dL/dx would cost a whole
// matmul, as much as each of the others (torch's own linear skips it too). A gradient with its
// rows and columns swapped has the right numbers in the wrong places; where in == out, its shape
// hides that. The tests compare both gradients with autograd's through x w^T, for a weight that is
// not square.
torch::autograd::tensor_list Fp8LinearFunction::backward(torch::autograd::AutogradContext* ctx,
                                                         torch::autograd::tensor_list grad_outputs) {
  AMPLAB_TODO("transformer_fp8-4");
}

}  // namespace

torch::Tensor fp8_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& x_scale,
                         const torch::Tensor& w_scale) {
  if (x.dim() != 2 || weight.dim() != 2 || x.size(1) != weight.size(1))
    throw amplab::Error("fp8_linear: x must be (N, in) and weight (out, in); got x " + std::to_string(x.dim()) +
                        "-d and weight " + std::to_string(weight.dim()) + "-d with mismatched sizes");
  return Fp8LinearFunction::apply(x, weight, x_scale, w_scale);
}

// TODO(transformer_fp8-6): TODO 3's recipe (write it out here, or call your to_fp8) with the amax
// reduced over the last dimension only
// (keep it as a column, (N, 1), so that it broadcasts over each row). Pitfalls: the max over
// dim 0 gives one scale per column, the transpose of what the matmul expects; an all-zero row
// needs the floor as much as an all-zero tensor.
Fp8Rowwise to_fp8_rowwise(const torch::Tensor& x, Fp8Format format) {
  AMPLAB_TODO("transformer_fp8-6");
}

AmaxHistory::AmaxHistory(int64_t length, Fp8Format format) : length_(length), format_(format) {
  if (length < 1) throw amplab::Error("AmaxHistory: the length must be >= 1, got " + std::to_string(length));
  history_ = torch::zeros({length}, torch::kFloat32);
}

// TODO(transformer_fp8-5): the delayed scale (README, "delayed"), a 0-dim float32 tensor: TODO 3's
// scale, made from the largest amax the whole ring remembers; 1 while nothing has been recorded
// (a scale from kAmaxFloor would multiply by 4e14).
// Pitfalls: the latest amax alone is dynamic scaling one step late, not delayed scaling; no
// .item(): the choice between the two cases is made on the device.
torch::Tensor AmaxHistory::scale() const {
  AMPLAB_TODO("transformer_fp8-5");
}

// TODO(transformer_fp8-5): remember `amax` in the ring, overwriting the oldest entry once the ring
// is full. The first amax seen on another device moves the history there. Pitfall: write into
// the tensor on the device (a device copy, no sync), not through a host number.
void AmaxHistory::record(const torch::Tensor& amax) {
  AMPLAB_TODO("transformer_fp8-5");
}

// TODO(transformer_fp8-5): the state to checkpoint: a copy of the ring and the next slot.
// Pitfall: without next, a restored history overwrites the wrong (not the oldest) amax.
AmaxHistory::State AmaxHistory::state() const {
  AMPLAB_TODO("transformer_fp8-5");
}

// TODO(transformer_fp8-5): restore a saved state (an amplab::Error when its length differs).
void AmaxHistory::load_state(const State& state) {
  AMPLAB_TODO("transformer_fp8-5");
}

}  // namespace transformer_fp8
