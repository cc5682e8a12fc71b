// The MNIST network's head after fc1, log_softmax(fc2(dropout(relu(h))), 1), in one kernel forward
// and one kernel backward, for bf16 and fp16 autocast. Autocast runs it as 15 kernels (the ReLU,
// the dropout, the casts of fc2's parameters, fc2, log-softmax, their backwards, the casts back),
// each a launch of its own on 128 x 128 values or fewer.
//
// Forward: one warp per row of h; a lane holds four of its 128 features and fc2's weights for them,
// and the ten class sums are added across the warp. Backward: one warp per row again; it draws the
// row's dropout mask again and writes the row's gradient of h. fc2's gradients are summed over a
// block's rows, then the last block to finish adds the blocks' sums in a fixed order (the same bits
// on every run): one kernel, no second launch for the sum.
//
// Dropout's mask is drawn in the kernel from the CUDA generator (philox_dropout.cuh): graph-safe,
// exact on resume, a mask with PyTorch's distribution but not PyTorch's mask. Values follow the ops
// autocast runs: fc2's parameters rounded to the dtype, the dropout's output and fc2's sums rounded
// to it, log-softmax in float32 (its output is float32), its gradient rounded to the dtype on the
// way back into fc2, as autocast's cast rounds it. fc2's gradients are float32 sums of those 16-bit
// values, not rounded to the dtype first (as the fast path's linear gives them).
#pragma once

#include <ATen/core/Tensor.h>

namespace amplab::cuda {

// h (N, 128) contiguous bf16 or fp16; w2 (10, 128) and b2 (10) float32 contiguous, on h's GPU.
// Otherwise the caller runs PyTorch's ops.
bool mnist_head_supported(const at::Tensor& h, const at::Tensor& w2, const at::Tensor& b2);

struct MnistHead {
  at::Tensor log_probs;  // (N, 10) float32
  at::Tensor state;      // int64: where the backward finds the dropout mask again, and its count of blocks
};
// p: dropout's probability of zeroing a feature (0: no dropout, as in evaluation).
MnistHead mnist_head_forward(const at::Tensor& h, const at::Tensor& w2, const at::Tensor& b2, double p);

struct MnistHeadGrads {
  at::Tensor h;       // (N, 128), h's dtype
  at::Tensor w2, b2;  // float32
};
// grad_log_probs (N, 10): the gradient of forward's log_probs; the rest as forward had or gave them.
MnistHeadGrads mnist_head_backward(const at::Tensor& grad_log_probs, const MnistHead& saved, const at::Tensor& h,
                                   const at::Tensor& w2, double p);

}  // namespace amplab::cuda
