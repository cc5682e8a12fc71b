#include "amplab/fused_layers.hpp"

#include <torch/autograd.h>
#include <torch/nn/functional/pooling.h>

#if AMPLAB_WITH_CUDA
#include "amplab/cuda/bias_relu.hpp"
#endif

namespace amplab {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// The bias as autocast hands it to the layer: in x's dtype, shaped to broadcast along dimension 1.
torch::Tensor bias_like(const torch::Tensor& x, const torch::Tensor& bias) { return bias.to(x.scalar_type()); }

torch::Tensor broadcastable(const torch::Tensor& x, const torch::Tensor& bias) {
  std::vector<int64_t> shape(x.dim(), 1);
  shape[1] = bias.size(0);
  return bias.view(shape);
}

#if AMPLAB_WITH_CUDA
struct BiasRelu : torch::autograd::Function<BiasRelu> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& bias) {
    torch::Tensor y = cuda::bias_relu_forward(x, bias);
    ctx->save_for_backward({y});
    return y;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto [grad_x, grad_bias] = cuda::bias_relu_backward(grads[0], ctx->get_saved_variables()[0]);
    return {grad_x, grad_bias};
  }
};

struct BiasReluMaxPool2 : torch::autograd::Function<BiasReluMaxPool2> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& bias) {
    ctx->save_for_backward({x, bias});  // the backward finds each window's maximum again
    return cuda::bias_relu_max_pool2_forward(x, bias);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    auto [grad_x, grad_bias] = cuda::bias_relu_max_pool2_backward(grads[0], saved[0], saved[1]);
    return {grad_x, grad_bias};
  }
};
#endif

}  // namespace

bool bias_relu_runs_fused(const torch::Tensor& x, const torch::Tensor& bias) {
#if AMPLAB_WITH_CUDA
  return cuda::bias_relu_supported(x, bias_like(x, bias));
#else
  return false;
#endif
}

bool bias_relu_max_pool2_runs_fused(const torch::Tensor& x, const torch::Tensor& bias) {
#if AMPLAB_WITH_CUDA
  return cuda::bias_relu_max_pool2_supported(x, bias_like(x, bias));
#else
  return false;
#endif
}

torch::Tensor bias_relu(const torch::Tensor& x, const torch::Tensor& bias) {
  torch::Tensor b = bias_like(x, bias);
#if AMPLAB_WITH_CUDA
  if (cuda::bias_relu_supported(x, b)) return BiasRelu::apply(x, b);
#endif
  return torch::relu(x + broadcastable(x, b));
}

torch::Tensor bias_relu_max_pool2(const torch::Tensor& x, const torch::Tensor& bias) {
  torch::Tensor b = bias_like(x, bias);
#if AMPLAB_WITH_CUDA
  if (cuda::bias_relu_max_pool2_supported(x, b)) return BiasReluMaxPool2::apply(x, b);
#endif
  return torch::max_pool2d(torch::relu(x + broadcastable(x, b)), /*kernel_size=*/2);
}

}  // namespace amplab
