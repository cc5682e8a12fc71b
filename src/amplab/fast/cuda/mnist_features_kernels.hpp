// The MNIST network's features, dropout(max_pool2d(relu(conv2(relu(conv1(x)))), 2)), in one kernel forward
// and one kernel (plus a sum over images) backward, for bf16 and fp16 autocast on a Hopper-class GPU.
//
// One block per image. The block computes conv1 + bias + ReLU into shared memory (32 x 26 x 26, never
// written to global memory), then conv2 as an implicit GEMM on tensor cores (mma.sync, fp32 sums;
// M = 24 rows x 26 columns of output positions, N = 64 channels, K = 9 taps x 32 channels), then
// bias + ReLU + 2x2 max-pool from shared memory, then the dropout after the pool (its mask drawn in
// the kernel from the CUDA generator: PyTorch's distribution, not PyTorch's mask). What leaves the
// block is the pooled output (N, 64, 12, 12) and one byte per pooled value: which of its window's
// four inputs the pool took, whether the ReLU let it through, whether dropout kept it. Backward
// recomputes conv1 from the image (cheaper than storing it), routes the pooled gradient back through
// dropout, pool and ReLU, and computes conv2's weight gradient, its input
// gradient, the ReLU of conv1 and conv1's weight gradient, all in the same block; each image leaves
// its partial sums, and a second kernel adds them over the images in a fixed order.
//
// Values follow the ops autocast runs: the parameters (float32) and the images rounded to the
// autocast dtype, each convolution's sum rounded to it before its bias, the bias sum rounded before
// the ReLU, the pool keeps the first maximum of its window (a NaN wins), gradients rounded to the
// dtype and returned as float32 (what the cast's backward gives the parameters). Sums are in float
// in an order of ours, so values agree with cuDNN's to the dtype's rounding, not to the bit.
#pragma once

#include <ATen/core/Tensor.h>

namespace amplab::cuda {

// x (N, 1, 28, 28) dense, float32 or `dtype`; conv1 (32, 1, 3, 3) + (32), conv2 (64, 32, 3, 3) +
// (64), float32 parameters of any strides; dtype bf16 or fp16; a GPU with the shared memory a
// block needs (about 212 KB: Hopper). Otherwise the caller runs the layers one by one.
bool mnist_features_supported(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                              const at::Tensor& b2, at::ScalarType dtype);

struct MnistFeatures {
  at::Tensor y;      // (N, 64, 12, 12) contiguous, dtype
  at::Tensor route;  // (N, 64, 12, 12) uint8: bits 0-1 the window's input the pool took, bit 2 ReLU
                     // passed, bit 3 dropout kept it
};
// p: the probability with which the dropout after the pool zeroes an output (0: no dropout). Its
// mask is drawn from the CUDA generator in the kernel (philox_dropout.cuh) and kept in route.
MnistFeatures mnist_features_forward(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1,
                                     const at::Tensor& w2, const at::Tensor& b2, at::ScalarType dtype, double p);

struct MnistFeatureGrads {
  at::Tensor w1, b1, w2, b2;  // float32, each in its parameter's layout
};
// grad_y: the gradient of forward's y (any strides); route, x, the parameters and p as forward had them.
MnistFeatureGrads mnist_features_backward(const at::Tensor& grad_y, const at::Tensor& route, const at::Tensor& x,
                                          const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                                          const at::Tensor& b2, at::ScalarType dtype, double p);

}  // namespace amplab::cuda
