// Lab 7, transformers in low precision and FP8 training: the functions you implement
// (starter/transformer_fp8/transformer_fp8.cpp). The GPT that uses them is given (gpt.hpp); the
// lab binary (apps/transformer_fp8) trains it on Shakespeare in fp32, tf32, fp16, bf16 and with
// FP8 linears; tests/labs/transformer_fp8_test.cpp grades them. See labs/transformer_fp8/README.md.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "amplab/infra/error.hpp"  // AMPLAB_TODO in the starter

namespace transformer_fp8 {

// ---- Attention ----------------------------------------------------------------------------------

// TODO(transformer_fp8-1): causal self-attention written out (the "math" path):
// softmax(q k^T / sqrt(D) + causal mask) v, with dropout on the attention weights when training.
// q, k, v: (B, H, T, D), one dtype (fp32 or bf16); returns (B, H, T, D) in that dtype. Query t
// attends to keys 0..t. Matches torch::scaled_dot_product_attention(q, k, v, {}, dropout_p,
// /*is_causal=*/true) in values and gradients, and with the same seed, draws the same dropout.
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double dropout_p,
                               bool training);

// TODO(transformer_fp8-2): attention that survives fp16. `allowed`: bool, broadcastable to
// (B, H, T, S), true where query t may attend to key s (a causal mask, padding, ...). Works for
// q, k, v in fp16 whose raw scores q.k overflow fp16 (|q||k| > 65504) while the scaled ones fit,
// and for a query row with no allowed key: its output is zeros (as torch's SDPA gives). Returns
// q's dtype; values close to the same attention computed in fp32.
torch::Tensor safe_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& allowed, double dropout_p, bool training);

// ---- FP8 tensorwise scaling ----------------------------------------------------------------------

// The two FP8 formats of training: e4m3 (4 exponent bits, 3 mantissa bits, largest 448; no
// infinity) for weights and activations, e5m2 (5 and 2, largest 57344) for gradients.
enum class Fp8Format { e4m3, e5m2 };
inline torch::ScalarType fp8_dtype(Fp8Format format) {
  return format == Fp8Format::e4m3 ? torch::kFloat8_e4m3fn : torch::kFloat8_e5m2;
}
inline double fp8_max(Fp8Format format) { return format == Fp8Format::e4m3 ? 448.0 : 57344.0; }
// The smallest amax a scale is made from: an all-zero tensor gets a large finite scale, not inf.
inline constexpr double kAmaxFloor = 1e-12;

// TODO(transformer_fp8-3): the three steps of tensorwise scaling.
// max |x| over all elements: a 0-dim float32 tensor on x's device (no host sync).
torch::Tensor abs_max(const torch::Tensor& x);
// fp8_max(format) / max(amax, kAmaxFloor): a 0-dim float32 tensor on amax's device.
torch::Tensor scale_from_amax(const torch::Tensor& amax, Fp8Format format);
// x * scale computed in float32, saturated to [-fp8_max, fp8_max], cast to fp8_dtype(format).
torch::Tensor to_fp8(const torch::Tensor& x, const torch::Tensor& scale, Fp8Format format);

// Given: the values an fp8 tensor stands for, data / scale, in `dtype`.
inline torch::Tensor from_fp8(const torch::Tensor& data, const torch::Tensor& scale,
                              torch::ScalarType dtype = torch::kFloat32) {
  return (data.to(torch::kFloat32) / scale).to(dtype);
}

// ---- Casts that cost one pass (TODO 7, the stretch) ---------------------------------------------

// Given: TODO 3's abs_max and to_fp8 on your kernels (fp8_kernels.hpp): x a CUDA tensor of
// float32, bf16 or fp16 (any layout: a non-contiguous x is copied first), scale a 0-dim float32
// tensor on x's device. The same results as abs_max and to_fp8, bit for bit.
torch::Tensor abs_max_fast(const torch::Tensor& x);
torch::Tensor to_fp8_fast(const torch::Tensor& x, const torch::Tensor& scale, Fp8Format format);

// Given: what the FP8 linear layer (TODO 4 and the GPT's Float8Linear) measures and casts with.
// On a GPU, once your TODO 7 kernels are done and give what your abs_max and to_fp8 give on a
// probe tensor (checked once per process, and the log says which path it took), abs_max_fast and
// to_fp8_fast; otherwise abs_max and to_fp8.
torch::Tensor amax_for_cast(const torch::Tensor& x);
torch::Tensor cast_to_fp8(const torch::Tensor& x, const torch::Tensor& scale, Fp8Format format);

// An fp8 matrix in both layouts: `data` (rows, cols) and `transposed`, its transpose as a
// contiguous (cols, rows) tensor (what an FP8 matmul of backward takes where the other layout
// would need a copy).
struct Fp8WithTranspose {
  torch::Tensor data, transposed;
};
// Given: your transposing kernel on a 2-D CUDA x whose sizes are multiples of 16.
Fp8WithTranspose to_fp8_transposed_fast(const torch::Tensor& x, const torch::Tensor& scale, Fp8Format format);
// Given: as cast_to_fp8, both layouts: your transposing kernel where it applies, otherwise the
// cast and a copy of its transpose.
Fp8WithTranspose cast_to_fp8_with_transpose(const torch::Tensor& x, const torch::Tensor& scale, Fp8Format format);

// TODO(transformer_fp8-4): y = x w^T with both operands in e4m3, on torch's FP8 matmul
// (at::_scaled_mm), as an autograd function: backward casts the output gradient to e5m2 and
// computes the input and weight gradients with two more FP8 matmuls.
// x: (N, in), weight: (out, in), x_scale / w_scale: 0-dim float32 scales to cast them with.
// Returns (N, out) in x's dtype; the weight's gradient comes back in the weight's dtype.
torch::Tensor fp8_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& x_scale,
                         const torch::Tensor& w_scale);

// TODO(transformer_fp8-6), the stretch: rowwise scaling. One scale per row of x (N, K): each
// row's amax, fp8_max / max(amax, kAmaxFloor), and each row cast (saturated) with its own scale.
// An outlier then coarsens only its own row. A GPU's _scaled_mm takes such scales as (N, 1) for
// its first operand and (1, M) for its second (the CPU's takes one scale per tensor only).
struct Fp8Rowwise {
  torch::Tensor data;   // (N, K) in fp8_dtype(format)
  torch::Tensor scale;  // (N, 1) float32: row i was multiplied by scale[i]
};
Fp8Rowwise to_fp8_rowwise(const torch::Tensor& x, Fp8Format format);

// ---- Delayed scaling ----------------------------------------------------------------------------

// TODO(transformer_fp8-5): the scale of a tensor from the amaxes of its last `length` steps
// (delayed scaling): a ring buffer of amaxes. scale() = fp8_max / the largest amax in the ring
// (1 while nothing non-zero was recorded); record() writes a step's amax over the oldest one.
// Everything stays on the device: no host sync per step.
class AmaxHistory {
 public:
  struct State {
    torch::Tensor history;  // (length,) float32, in ring order (slot i, not time order)
    int64_t next = 0;       // the slot the next record() writes
  };

  AmaxHistory(int64_t length, Fp8Format format);
  torch::Tensor scale() const;              // 0-dim float32 on the history's device
  void record(const torch::Tensor& amax);   // amax: 0-dim float32
  State state() const;                      // a copy: recording more leaves it unchanged
  void load_state(const State& state);      // continues exactly where `state` was saved

  int64_t length() const { return length_; }
  Fp8Format format() const { return format_; }

 private:
  int64_t length_;
  Fp8Format format_;
  torch::Tensor history_;  // (length,) float32, zeros at first; moves to the first amax's device
  int64_t next_ = 0;
};

}  // namespace transformer_fp8
