// Lab 6, CUDA kernels: the cost model (TODO 1), the tensor wrappers around the kernels' launchers
// (given) and the autograd function of the fused op (TODO 15). See labs/cuda_kernels/README.md.
#include "cuda_kernels.hpp"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/autograd.h>
#include <torch/torch.h>

#include "amplab/infra/error.hpp"

namespace cuda_kernels {

namespace {

// "<function>: <name> = <value>: <why>", as the launchers say it (cuda_check.cuh).
[[maybe_unused]] void check_count(const char* function, const char* name, int64_t value, int64_t at_least = 0) {
  if (value < at_least)
    throw amplab::Error(std::string(function) + ": " + name + " = " + std::to_string(value) + ": must be >= " +
                        std::to_string(at_least));
}

}  // namespace

// ---- the cost model --------------------------------------------------------------------------------

Cost vector_add_cost(int64_t n) {
  // TODO(cuda_kernels-1): The least a kernel must do (see Cost): each input read once, each output
  // written once, one operation per add. fp32: 4 bytes an element. Check the sizes first
  // (amplab::Error naming the argument, as check_count above says it). Then the three below.
  // BEGIN SOLUTION
  check_count("vector_add_cost", "n", n);
  return {static_cast<double>(n), 12.0 * static_cast<double>(n)};  // read a and b, write c
  // END SOLUTION
}

Cost reduce_cost(int64_t n) {
  // TODO(cuda_kernels-1): n inputs in, one float out, n - 1 adds (none for n == 0).
  // BEGIN SOLUTION
  check_count("reduce_cost", "n", n);
  const double inputs = static_cast<double>(n);
  return {n > 0 ? inputs - 1 : 0.0, 4.0 * (inputs + 1)};
  // END SOLUTION
}

Cost conv2d_cost(int64_t h, int64_t w, int64_t radius) {
  // TODO(cuda_kernels-1): Every output pixel is a (2r+1)^2-term dot product: a multiply and an add
  // per term (count all terms, also at the border where some read the zero padding). Bytes: the
  // image, the output and the filter, once each.
  // BEGIN SOLUTION
  check_count("conv2d_cost", "h", h);
  check_count("conv2d_cost", "w", w);
  check_count("conv2d_cost", "radius", radius);
  const double pixels = static_cast<double>(h) * static_cast<double>(w);
  const double taps = static_cast<double>((2 * radius + 1) * (2 * radius + 1));
  return {2.0 * taps * pixels, 4.0 * (2.0 * pixels + taps)};
  // END SOLUTION
}

Cost matmul_cost(int64_t m, int64_t n, int64_t k, int64_t element_bytes) {
  // TODO(cuda_kernels-1): m * n dot products of length k; A, B and C once each. Watch the int64
  // overflow at large sizes: compute in double.
  // BEGIN SOLUTION
  check_count("matmul_cost", "m", m);
  check_count("matmul_cost", "n", n);
  check_count("matmul_cost", "k", k);
  check_count("matmul_cost", "element_bytes", element_bytes, 1);
  const double md = static_cast<double>(m), nd = static_cast<double>(n), kd = static_cast<double>(k);
  return {2.0 * md * nd * kd, static_cast<double>(element_bytes) * (md * kd + kd * nd + md * nd)};
  // END SOLUTION
}

// ---- tensor wrappers -------------------------------------------------------------------------------

namespace {

std::string shape_of(const torch::Tensor& t) {
  std::string out = "(";
  for (int64_t d = 0; d < t.dim(); ++d) out += (d ? ", " : "") + std::to_string(t.size(d));
  return out + (t.dim() == 1 ? ",)" : ")");
}

// A CUDA tensor, contiguous, of `dtype` and `dims` dimensions; else an amplab::Error naming it.
void check_tensor(const char* function, const char* name, const torch::Tensor& t, torch::ScalarType dtype,
                  int64_t dims) {
  const std::string where = std::string(function) + ": " + name;
  if (!t.defined()) throw amplab::Error(where + " is an undefined tensor");
  if (!t.is_cuda())
    throw amplab::Error(where + " is on " + t.device().str() +
                        ": the lab's kernels run on a GPU (move it there with .to(torch::kCUDA))");
  if (t.scalar_type() != dtype)
    throw amplab::Error(where + " is " + std::string(c10::toString(t.scalar_type())) + ", expected " +
                        c10::toString(dtype));
  if (t.dim() != dims)
    throw amplab::Error(where + " has shape " + shape_of(t) + ": expected " + std::to_string(dims) + " dimensions");
  if (!t.is_contiguous()) throw amplab::Error(where + " is not contiguous (call .contiguous() first)");
}

void check_same_device(const char* function, const char* name, const torch::Tensor& t, const torch::Tensor& first) {
  if (t.device() != first.device())
    throw amplab::Error(std::string(function) + ": " + name + " is on " + t.device().str() + ", the others on " +
                        first.device().str());
}

cudaStream_t current_stream() { return at::cuda::getCurrentCUDAStream().stream(); }

DType dtype_of(const char* function, const torch::Tensor& x) {
  if (!x.defined()) throw amplab::Error(std::string(function) + ": x is an undefined tensor");
  if (x.scalar_type() == torch::kFloat32) return DType::f32;
  if (x.scalar_type() == torch::kBFloat16) return DType::bf16;
  throw amplab::Error(std::string(function) + ": x is " + c10::toString(x.scalar_type()) +
                      ": the fused op takes float32 or bfloat16");
}

}  // namespace

torch::Tensor vector_add(const torch::Tensor& a, const torch::Tensor& b, AddVersion version, int threads) {
  check_tensor("vector_add", "a", a, torch::kFloat32, 1);
  check_tensor("vector_add", "b", b, torch::kFloat32, 1);
  check_same_device("vector_add", "b", b, a);
  if (b.numel() != a.numel())
    throw amplab::Error("vector_add: b has shape " + shape_of(b) + ", a has " + shape_of(a) + ": they must match");
  c10::cuda::CUDAGuard guard(a.device());
  torch::Tensor c = torch::empty_like(a);
  auto launch = version == AddVersion::grid_stride ? vector_add_grid_stride : vector_add_float4;
  launch(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), a.numel(), threads, current_stream());
  return c;
}

torch::Tensor reduce_sum(const torch::Tensor& x, ReduceVersion version, int threads) {
  check_tensor("reduce_sum", "x", x, torch::kFloat32, 1);
  c10::cuda::CUDAGuard guard(x.device());
  torch::Tensor out = torch::empty({}, x.options());
  torch::Tensor workspace = torch::empty({reduce_workspace_floats(x.numel())}, x.options());
  decltype(&reduce_interleaved) launch = nullptr;
  switch (version) {
    case ReduceVersion::interleaved: launch = reduce_interleaved; break;
    case ReduceVersion::sequential: launch = reduce_sequential; break;
    case ReduceVersion::first_add: launch = reduce_first_add; break;
    case ReduceVersion::warp_shuffle: launch = reduce_warp_shuffle; break;
  }
  launch(x.data_ptr<float>(), x.numel(), out.data_ptr<float>(), workspace.data_ptr<float>(), threads, current_stream());
  return out;
}

torch::Tensor conv2d(const torch::Tensor& image, const torch::Tensor& filter, ConvVersion version) {
  check_tensor("conv2d", "image", image, torch::kFloat32, 2);
  check_tensor("conv2d", "filter", filter, torch::kFloat32, 2);
  check_same_device("conv2d", "filter", filter, image);
  const int64_t size = filter.size(0);
  if (filter.size(1) != size || (size != 3 && size != 5))
    throw amplab::Error("conv2d: filter has shape " + shape_of(filter) + ": expected (3, 3) or (5, 5)");
  c10::cuda::CUDAGuard guard(image.device());
  torch::Tensor out = torch::empty_like(image);
  auto launch = version == ConvVersion::naive ? conv2d_naive : conv2d_tiled;
  launch(image.data_ptr<float>(), image.size(0), image.size(1), filter.data_ptr<float>(), static_cast<int>(size / 2),
         out.data_ptr<float>(), current_stream());
  return out;
}

torch::Tensor matmul(const torch::Tensor& a, const torch::Tensor& b, MatmulVersion version) {
  const auto dtype = version == MatmulVersion::wmma_bf16 ? torch::kBFloat16 : torch::kFloat32;
  check_tensor("matmul", "a", a, dtype, 2);
  check_tensor("matmul", "b", b, dtype, 2);
  check_same_device("matmul", "b", b, a);
  if (b.size(0) != a.size(1))
    throw amplab::Error("matmul: b has shape " + shape_of(b) + ", a has " + shape_of(a) + ": b needs " +
                        std::to_string(a.size(1)) + " rows");
  c10::cuda::CUDAGuard guard(a.device());
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  torch::Tensor c = torch::empty({m, n}, a.options());
  switch (version) {
    case MatmulVersion::naive:
      matmul_naive(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), m, n, k, current_stream());
      break;
    case MatmulVersion::tiled:
      matmul_tiled(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), m, n, k, current_stream());
      break;
    case MatmulVersion::register_blocked:
      matmul_register_blocked(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), m, n, k, current_stream());
      break;
    case MatmulVersion::wmma_bf16:
      matmul_wmma_bf16(a.data_ptr(), b.data_ptr(), c.data_ptr(), m, n, k, current_stream());
      break;
  }
  return c;
}

torch::Tensor bias_gelu_forward(const torch::Tensor& x, const torch::Tensor& bias) {
  const DType dtype = dtype_of("bias_gelu_forward", x);
  check_tensor("bias_gelu_forward", "x", x, x.scalar_type(), 2);
  check_tensor("bias_gelu_forward", "bias", bias, x.scalar_type(), 1);
  check_same_device("bias_gelu_forward", "bias", bias, x);
  if (bias.size(0) != x.size(1))
    throw amplab::Error("bias_gelu_forward: bias has shape " + shape_of(bias) + ", x has " + shape_of(x) +
                        ": bias needs one value per column of x");
  c10::cuda::CUDAGuard guard(x.device());
  torch::Tensor y = torch::empty_like(x);
  cuda_kernels::bias_gelu_forward(x.data_ptr(), bias.data_ptr(), y.data_ptr(), x.size(0), x.size(1), dtype,
                                  current_stream());
  return y;
}

std::pair<torch::Tensor, torch::Tensor> bias_gelu_backward(const torch::Tensor& grad_y, const torch::Tensor& x,
                                                           const torch::Tensor& bias) {
  const DType dtype = dtype_of("bias_gelu_backward", x);
  check_tensor("bias_gelu_backward", "x", x, x.scalar_type(), 2);
  check_tensor("bias_gelu_backward", "grad_y", grad_y, x.scalar_type(), 2);
  check_tensor("bias_gelu_backward", "bias", bias, x.scalar_type(), 1);
  check_same_device("bias_gelu_backward", "grad_y", grad_y, x);
  check_same_device("bias_gelu_backward", "bias", bias, x);
  if (grad_y.sizes() != x.sizes())
    throw amplab::Error("bias_gelu_backward: grad_y has shape " + shape_of(grad_y) + ", x has " + shape_of(x));
  if (bias.size(0) != x.size(1))
    throw amplab::Error("bias_gelu_backward: bias has shape " + shape_of(bias) + ", x has " + shape_of(x));
  c10::cuda::CUDAGuard guard(x.device());
  torch::Tensor grad_x = torch::empty_like(x), grad_bias = torch::empty_like(bias);
  cuda_kernels::bias_gelu_backward(grad_y.data_ptr(), x.data_ptr(), bias.data_ptr(), grad_x.data_ptr(),
                                   grad_bias.data_ptr(), x.size(0), x.size(1), dtype, current_stream());
  return {grad_x, grad_bias};
}

// ---- the fused op, differentiable -----------------------------------------------------------------

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

struct BiasGelu : torch::autograd::Function<BiasGelu> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& bias) {
    // TODO(cuda_kernels-15): The forward of a torch::autograd::Function: the fused forward kernel
    // (its tensor wrapper above checks the tensors), and for backward only what the fused backward
    // kernel reads. Which tensors? That kernel recomputes the biased input itself, so nothing of
    // x's size needs keeping beyond x (the composed ops keep the biased input, a second tensor of
    // x's size, for gelu's backward).
    // BEGIN SOLUTION
    torch::Tensor y = bias_gelu_forward(x, bias);
    ctx->save_for_backward({x, bias});
    return y;
    // END SOLUTION
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    // TODO(cuda_kernels-15): One gradient per input of forward, in order: (grad_x, grad_bias) from
    // the fused backward kernel. The incoming gradient may be any strides (the gradient of a sum is
    // an expanded tensor, stride 0): the kernel wants it contiguous.
    // BEGIN SOLUTION
    const auto saved = ctx->get_saved_variables();
    auto [grad_x, grad_bias] = bias_gelu_backward(grads[0].contiguous(), saved[0], saved[1]);
    return {grad_x, grad_bias};
    // END SOLUTION
  }
};

}  // namespace

torch::Tensor bias_gelu(const torch::Tensor& x, const torch::Tensor& bias) {
  if (!x.defined() || !bias.defined()) throw amplab::Error("bias_gelu: x and bias must be defined tensors");
  return BiasGelu::apply(x, bias.to(x.scalar_type()));
}

torch::Tensor bias_gelu_composed(const torch::Tensor& x, const torch::Tensor& bias) {
  return torch::gelu(x + bias.to(x.scalar_type()), "tanh");
}

// ---- names -------------------------------------------------------------------------------------------

std::string name(AddVersion version) { return version == AddVersion::grid_stride ? "grid-stride" : "float4"; }

std::string name(ReduceVersion version) {
  switch (version) {
    case ReduceVersion::interleaved: return "interleaved";
    case ReduceVersion::sequential: return "sequential";
    case ReduceVersion::first_add: return "first add during load";
    case ReduceVersion::warp_shuffle: return "warp shuffles";
  }
  return "?";
}

std::string name(ConvVersion version) { return version == ConvVersion::naive ? "naive" : "tiled"; }

std::string name(MatmulVersion version) {
  switch (version) {
    case MatmulVersion::naive: return "naive";
    case MatmulVersion::tiled: return "tiled";
    case MatmulVersion::register_blocked: return "register-blocked";
    case MatmulVersion::wmma_bf16: return "wmma bf16";
  }
  return "?";
}

}  // namespace cuda_kernels
