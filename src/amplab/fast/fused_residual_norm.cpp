#include "amplab/fast/fused_residual_norm.hpp"

#include <torch/autograd.h>
#include <torch/nn/functional/dropout.h>
#include <torch/nn/functional/normalization.h>

#if AMPLAB_WITH_CUDA
#include "amplab/fast/cuda/residual_norm_kernels.hpp"
#endif

namespace amplab {

namespace {

#if AMPLAB_WITH_CUDA
using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// The kernels' two passes, shared by the step with a residual stream and the one without.
tensor_list residual_norm_forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& branch,
                                  const torch::Tensor& weight, double p, double eps) {
  cuda::ResidualNormSaved s = cuda::dropout_add_layer_norm_forward(x, branch, weight, p, eps);
  ctx->save_for_backward({s.sum, s.normed, s.mean, s.rstd, s.philox, weight});
  ctx->saved_data["p"] = p;
  return {s.sum, s.normed};
}

cuda::ResidualNormGrads residual_norm_backward(AutogradContext* ctx, const tensor_list& grads, bool x_needs_grad) {
  const auto saved = ctx->get_saved_variables();
  const cuda::ResidualNormSaved s{saved[0], saved[1], saved[2], saved[3], saved[4]};
  return cuda::dropout_add_layer_norm_backward(grads[0], grads[1], s, saved[5], ctx->saved_data["p"].toDouble(),
                                               x_needs_grad);
}

struct DropoutAddLayerNorm : torch::autograd::Function<DropoutAddLayerNorm> {
  static tensor_list forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& branch,
                             const torch::Tensor& weight, double p, double eps) {
    return residual_norm_forward(ctx, x, branch, weight, p, eps);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const cuda::ResidualNormGrads g = residual_norm_backward(ctx, grads, ctx->needs_input_grad(0));
    return {g.x, g.branch, g.weight, torch::Tensor(), torch::Tensor()};
  }
};

// Without a residual stream (an autograd Function takes no undefined tensor as an input).
struct DropoutLayerNorm : torch::autograd::Function<DropoutLayerNorm> {
  static tensor_list forward(AutogradContext* ctx, const torch::Tensor& branch, const torch::Tensor& weight, double p,
                             double eps) {
    return residual_norm_forward(ctx, torch::Tensor(), branch, weight, p, eps);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const cuda::ResidualNormGrads g = residual_norm_backward(ctx, grads, /*x_needs_grad=*/false);
    return {g.branch, g.weight, torch::Tensor(), torch::Tensor()};
  }
};
#endif

}  // namespace

bool dropout_add_layer_norm_runs_fused(const torch::Tensor& x, const torch::Tensor& branch, const torch::Tensor& weight) {
#if AMPLAB_WITH_CUDA
  return cuda::dropout_add_layer_norm_supported(x, branch, weight);
#else
  (void)x, (void)branch, (void)weight;
  return false;
#endif
}

std::pair<torch::Tensor, torch::Tensor> dropout_add_layer_norm(const torch::Tensor& x, const torch::Tensor& branch,
                                                               const torch::Tensor& weight, double p, double eps) {
#if AMPLAB_WITH_CUDA
  if (dropout_add_layer_norm_runs_fused(x, branch, weight)) {
    tensor_list out = x.defined() ? DropoutAddLayerNorm::apply(x, branch, weight, p, eps)
                                  : DropoutLayerNorm::apply(branch, weight, p, eps);
    return {out[0], out[1]};
  }
#endif
  torch::Tensor dropped = torch::dropout(branch, p, /*train=*/p > 0);
  torch::Tensor sum = x.defined() ? x + dropped : dropped.to(torch::kFloat32);
  return {sum, torch::layer_norm(sum, {weight.size(0)}, weight, /*bias=*/{}, eps)};
}

}  // namespace amplab
