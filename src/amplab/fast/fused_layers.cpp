#include "amplab/fast/fused_layers.hpp"

#include <ATen/autocast_mode.h>
#include <torch/autograd.h>
#include <torch/nn/functional/conv.h>
#include <torch/nn/functional/pooling.h>

#if AMPLAB_WITH_CUDA
#include "amplab/fast/cuda/layer_kernels.hpp"
#include "amplab/fast/cuda/mnist_features_kernels.hpp"
#include "amplab/fast/cuda/mnist_head_kernels.hpp"
#endif

namespace amplab {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// The dtype a layer computes in: autocast's on a GPU where it is on, else the tensor's own.
torch::ScalarType compute_dtype(const torch::Tensor& t) {
  if (t.is_cuda() && at::autocast::is_autocast_enabled(at::kCUDA) && t.is_floating_point())
    return at::autocast::get_autocast_dtype(at::kCUDA);
  return t.scalar_type();
}

#if AMPLAB_WITH_CUDA
// x needs no gradient (images): only the weight's and the bias's are computed.
struct Conv3x3BiasRelu : torch::autograd::Function<Conv3x3BiasRelu> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& bias) {
    torch::Tensor y = cuda::conv3x3_bias_relu_forward(x, weight, bias);
    ctx->save_for_backward({y, x, weight});
    return y;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    auto [grad_weight, grad_bias] = cuda::conv3x3_bias_relu_backward(grads[0], saved[0], saved[1], saved[2]);
    return {torch::Tensor(), grad_weight, grad_bias};
  }
};

// Both convolutions, the pool and the dropout after it; the parameters come in float32 and their
// gradients go out in float32 (the kernels round them as autocast's casts would), x needs no gradient.
struct MnistFeatures : torch::autograd::Function<MnistFeatures> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w1,
                               const torch::Tensor& b1, const torch::Tensor& w2, const torch::Tensor& b2,
                               torch::ScalarType dtype, double p) {
    cuda::MnistFeatures out = cuda::mnist_features_forward(x, w1, b1, w2, b2, dtype, p);
    ctx->save_for_backward({out.route, x, w1, b1, w2, b2});
    ctx->saved_data["dtype"] = static_cast<int64_t>(dtype);
    ctx->saved_data["p"] = p;
    return out.y;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto s = ctx->get_saved_variables();
    const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    cuda::MnistFeatureGrads g = cuda::mnist_features_backward(grads[0], s[0], s[1], s[2], s[3], s[4], s[5], dtype,
                                                              ctx->saved_data["p"].toDouble());
    return {torch::Tensor(), g.w1, g.b1, g.w2, g.b2, torch::Tensor(), torch::Tensor()};
  }
};

// y = x w^T + b in the autocast dtype, as autocast's linear computes it (cuBLAS, the bias in its
// epilogue); backward writes the float32 parameters' gradients in float32 directly. The sums are the
// same; what differs from autocast's path is one rounding: its gradients are rounded to the dtype
// before the cast back to float32, these are not.
struct LinearFloatGrads : torch::autograd::Function<LinearFloatGrads> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& bias, torch::ScalarType dtype) {
    torch::Tensor w = weight.to(dtype);  // x is in dtype already (linear_runs_fused)
    ctx->save_for_backward({x, w});
    return at::addmm(bias.to(dtype), x, w.t());
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const torch::Tensor& input = saved[0];
    const torch::Tensor& w = saved[1];
    const torch::Tensor g = grads[0].contiguous();
    torch::Tensor grad_x, grad_w, grad_b;  // only those asked for (frozen parameters ask for none)
    if (ctx->needs_input_grad(0)) grad_x = g.mm(w);
    if (ctx->needs_input_grad(1)) grad_w = at::mm(g.t(), input, torch::kFloat);
    if (ctx->needs_input_grad(2)) grad_b = at::mm(at::ones({1, g.size(0)}, g.options()), g, torch::kFloat).view({-1});
    return {grad_x, grad_w, grad_b, torch::Tensor()};
  }
};

// log_softmax(fc2(dropout(relu(h)))): h in the autocast dtype, fc2's parameters and their gradients
// in float32, the dropout mask drawn in the kernel and drawn again in the backward.
struct MnistHead : torch::autograd::Function<MnistHead> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& h, const torch::Tensor& w2,
                               const torch::Tensor& b2, double p) {
    cuda::MnistHead out = cuda::mnist_head_forward(h, w2, b2, p);
    ctx->save_for_backward({out.log_probs, out.state, h, w2});
    ctx->saved_data["p"] = p;
    return out.log_probs;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto s = ctx->get_saved_variables();
    cuda::MnistHeadGrads g = cuda::mnist_head_backward(grads[0], {s[0], s[1]}, s[2], s[3], ctx->saved_data["p"].toDouble());
    return {g.h, g.w2, g.b2, torch::Tensor()};
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

// The tensors a layer hands its kernel (weight and bias cast as autocast would cast them for the
// layer), and whether our kernel takes them.
struct ConvCall {
  torch::Tensor weight, bias;
  bool fused = false;
};

ConvCall conv_call(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  const auto dtype = compute_dtype(weight);
  ConvCall call{weight.to(dtype).contiguous(), bias.to(dtype)};
#if AMPLAB_WITH_CUDA
  call.fused = !x.requires_grad() && cuda::conv3x3_bias_relu_supported(x, call.weight, call.bias);  // x's gradient: not ours
#endif
  return call;
}

struct PoolCall {
  torch::Tensor bias;
  bool fused = false;
};

PoolCall pool_call(const torch::Tensor& x, const torch::Tensor& bias) {
  PoolCall call{bias.to(x.scalar_type())};  // as autocast casts the layer's bias
#if AMPLAB_WITH_CUDA
  call.fused = cuda::bias_relu_max_pool2_supported(x, call.bias);
#endif
  return call;
}

}  // namespace

bool conv3x3_bias_relu_runs_fused(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  return conv_call(x, weight, bias).fused;
}

bool linear_runs_fused(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  const auto dtype = compute_dtype(weight);
  return x.is_cuda() && (dtype == torch::kBFloat16 || dtype == torch::kHalf) && x.dim() == 2 &&
         x.scalar_type() == dtype && weight.scalar_type() == torch::kFloat && bias.defined() &&
         bias.scalar_type() == torch::kFloat && weight.dim() == 2 && bias.dim() == 1 && x.size(1) == weight.size(1) &&
         bias.size(0) == weight.size(0) && weight.device() == x.device() && bias.device() == x.device();
}

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  if (linear_runs_fused(x, weight, bias)) return LinearFloatGrads::apply(x, weight, bias, compute_dtype(weight));
  return torch::linear(x, weight, bias);
}

bool mnist_features_runs_fused(const torch::Tensor& x, const torch::Tensor& w1, const torch::Tensor& b1,
                               const torch::Tensor& w2, const torch::Tensor& b2) {
#if AMPLAB_WITH_CUDA
  return !x.requires_grad() && cuda::mnist_features_supported(x, w1, b1, w2, b2, compute_dtype(w1));
#else
  return false;
#endif
}

torch::Tensor mnist_features(const torch::Tensor& x, const torch::Tensor& w1, const torch::Tensor& b1,
                             const torch::Tensor& w2, const torch::Tensor& b2, double p) {
#if AMPLAB_WITH_CUDA
  if (mnist_features_runs_fused(x, w1, b1, w2, b2)) return MnistFeatures::apply(x, w1, b1, w2, b2, compute_dtype(w1), p);
#endif
  return torch::dropout(bias_relu_max_pool2(torch::conv2d(conv3x3_bias_relu(x, w1, b1), w2), b2), p, /*train=*/p > 0);
}

bool mnist_head_runs_fused(const torch::Tensor& h, const torch::Tensor& w2, const torch::Tensor& b2) {
#if AMPLAB_WITH_CUDA
  return h.is_cuda() && compute_dtype(w2) == h.scalar_type() && cuda::mnist_head_supported(h, w2, b2);
#else
  return false;
#endif
}

torch::Tensor mnist_head(const torch::Tensor& h, const torch::Tensor& w2, const torch::Tensor& b2, double p) {
#if AMPLAB_WITH_CUDA
  if (mnist_head_runs_fused(h, w2, b2)) return MnistHead::apply(h, w2, b2, p);
#endif
  return torch::log_softmax(linear(torch::dropout(torch::relu(h), p, /*train=*/p > 0), w2, b2), /*dim=*/1);
}

bool bias_relu_max_pool2_runs_fused(const torch::Tensor& x, const torch::Tensor& bias) { return pool_call(x, bias).fused; }

torch::Tensor conv3x3_bias_relu(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  ConvCall call = conv_call(x, weight, bias);
#if AMPLAB_WITH_CUDA
  if (call.fused) return Conv3x3BiasRelu::apply(x, call.weight, call.bias);
#endif
  return torch::relu(torch::conv2d(x, weight, bias));
}

torch::Tensor bias_relu_max_pool2(const torch::Tensor& x, const torch::Tensor& bias) {
  PoolCall call = pool_call(x, bias);
#if AMPLAB_WITH_CUDA
  if (call.fused) return BiasReluMaxPool2::apply(x, call.bias);
#endif
  std::vector<int64_t> shape(x.dim(), 1);
  shape[1] = call.bias.size(0);
  return torch::max_pool2d(torch::relu(x + call.bias.view(shape)), /*kernel_size=*/2);
}

}  // namespace amplab
