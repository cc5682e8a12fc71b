// CUDA kernels of the fast path's FP8 MLP (src/amplab/fast/fused_fp8_mlp.hpp): a tensor's cast to
// FP8 in one pass, which also
//   - writes the transpose that backward's FP8 matmuls take (each 64 x 64 tile leaves through
//     shared memory a second time), when asked;
//   - takes the ReLU before it (forward: the next layer's input is relu of this layer's output,
//     never written in bf16) or the ReLU's backward (backward: the gradient kept where the gate,
//     the ReLU's input, is above 0);
//   - raises `amax` to the largest |value| it cast (before the scale), for the next step's delayed
//     scale: no pass of its own over the tensor.
// One kernel of a single block turns the amaxes of the past steps into this step's scales.
//
// Values: each element is taken to float32 (rounded to bfloat16 first when round_bf16: the cast
// autocast would make before a matmul), the ReLU or the gate applied, multiplied by *scale in
// float32, saturated to the format's largest finite value and rounded to nearest even: bit for bit
// (x.to(f32) * scale).clamp(-max, max).to(fp8). A NaN is cast as NaN and leaves amax as it was.
#pragma once

#include <ATen/core/Tensor.h>

namespace amplab::cuda {

enum class Fp8CastInput {
  plain,       // x as it is
  round_bf16,  // x (float32) rounded to bfloat16 first
  relu,        // max(x, 0)
  gated,       // x where gate > 0, else 0 (gate: bfloat16 of x's shape)
};

// Whether the kernel takes x: a CUDA float32 or bfloat16 (rows, cols) tensor, contiguous, 16-byte
// aligned, rows and cols multiples of 64; a gate, when given, bfloat16 of the same shape and layout.
bool fp8_cast_supported(const at::Tensor& x, const at::Tensor& gate);

// Casts x (as above) with the float32 scale at `scale` into `out` (rows, cols) and `out_t`
// (cols, rows), either of which may be undefined (not written; both undefined: amax only), and
// raises the float32 at `amax` (on the device, >= 0) to the largest |value|.
void fp8_cast(const at::Tensor& x, Fp8CastInput input, const at::Tensor& gate, const at::Tensor& scale,
              const at::Tensor& out, const at::Tensor& out_t, const at::Tensor& amax);

// For each state s: history (S, L) slot `*next` takes pending[s], which is then zeroed;
// scales (S, 2, 4) float32 gets [s][0][0] = limit[s] / the history's largest amax (1 while it holds
// none above 0) and [s][1][0] its reciprocal (each scalar 16-byte aligned, as cuBLASLt wants its
// scales); then next = (next + 1) % L. One block, S <= 1024; next: a 1-element int32 tensor.
void fp8_scales_advance(const at::Tensor& history, const at::Tensor& pending, const at::Tensor& next,
                        const at::Tensor& limits, const at::Tensor& scales);

}  // namespace amplab::cuda
