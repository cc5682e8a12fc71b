#include "amplab/fast/cuda/fused_adamw_launch.hpp"

#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/native/cuda/fused_adam_utils.cuh>
#include <c10/cuda/CUDAGuard.h>

namespace amplab::cuda {

namespace {

using at::native::ADAM_MODE;
using at::native::FusedAdamMathFunctor;
using at::native::FusedOptimizerTensorListMetadata;

constexpr int64_t kThreads = 512;  // PyTorch's block size for these kernels
constexpr int64_t kMinChunk = 2048;
constexpr int64_t kMaxChunk = 65536;  // PyTorch's chunk
constexpr int kMaxBlocksPerLaunch = 320;

template <int depth>
constexpr int max_tensors_per_launch() {
  return at::native::depth_to_max_tensors[depth - 1];
}

// PyTorch's multi_tensor_apply_kernel passes its fixed chunk size; this one passes ours.
template <class Metadata, class Functor, class... Args>
__global__ void __launch_bounds__(kThreads) chunked_kernel(Metadata meta, int64_t chunk_size, Functor functor, Args... args) {
  functor(chunk_size, meta, args...);
}

int64_t chunks_of(int64_t numel, int64_t chunk_size) { return (numel + chunk_size - 1) / chunk_size; }

// Fills metadata with tensors and their chunks, launching whenever the tensor or block table is
// full, the way PyTorch's multi_tensor_apply_for_fused_optimizer does.
template <int depth, class Functor, class... Args>
void launch_chunked(const std::vector<std::vector<at::Tensor>>& lists, const std::vector<at::Tensor>& steps,
                    int64_t chunk_size, Functor functor, Args... args) {
  FusedOptimizerTensorListMetadata<depth> meta;
  int blocks = 0;
  int tensors = 0;
  auto stream = at::cuda::getCurrentCUDAStream();
  auto launch = [&] {
    chunked_kernel<<<blocks, kThreads, 0, stream>>>(meta, chunk_size, functor, args...);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  for (size_t t = 0; t < lists[0].size(); ++t) {
    const int64_t numel = lists[0][t].numel();
    if (numel == 0) continue;
    meta.numel_for_tensor[tensors] = numel;
    meta.state_steps_addresses[tensors] = steps[t].const_data_ptr();
    for (int d = 0; d < depth; ++d) meta.addresses[d][tensors] = lists[d][t].const_data_ptr();
    ++tensors;
    const int64_t chunks = chunks_of(numel, chunk_size);
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      meta.block_to_tensor[blocks] = static_cast<unsigned char>(tensors - 1);
      meta.block_to_chunk[blocks] = static_cast<int>(chunk);
      ++blocks;
      const bool last_chunk = chunk == chunks - 1;
      if (blocks < kMaxBlocksPerLaunch && !(tensors == max_tensors_per_launch<depth>() && last_chunk)) continue;
      launch();
      blocks = 0;
      if (last_chunk) {
        tensors = 0;
      } else {  // the current tensor goes on in the next launch, as its first entry
        meta.numel_for_tensor[0] = meta.numel_for_tensor[tensors - 1];
        meta.state_steps_addresses[0] = meta.state_steps_addresses[tensors - 1];
        for (int d = 0; d < depth; ++d) meta.addresses[d][0] = meta.addresses[d][tensors - 1];
        tensors = 1;
      }
    }
  }
  if (blocks > 0) launch();
}

// What PyTorch's kernel needs of a state tensor: on ref's device, of its dtype, dense and laid out
// as ref.
bool same_layout(const at::Tensor& ref, const at::Tensor& t) {
  return t.is_cuda() && t.device() == ref.device() && t.scalar_type() == ref.scalar_type() &&
         t.layout() == at::kStrided && t.is_non_overlapping_and_dense() && t.sizes() == ref.sizes() &&
         t.strides() == ref.strides();
}

}  // namespace

int64_t adamw_chunk_size(const std::vector<int64_t>& numels) {
  for (int64_t chunk = kMinChunk; chunk < kMaxChunk; chunk *= 2) {
    int64_t blocks = 0;
    for (int64_t n : numels) blocks += chunks_of(n, chunk);
    if (blocks <= kMaxBlocksPerLaunch) return chunk;
  }
  return kMaxChunk;
}

bool can_run_fused_adamw_chunked(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                                 const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                                 const std::vector<at::Tensor>& max_exp_avg_sqs) {
  if (params.empty() || !params[0].is_cuda()) return false;
  const auto type = params[0].scalar_type();
  if (type != at::kFloat && type != at::kHalf && type != at::kBFloat16 && type != at::kDouble) return false;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    const bool dense_like_the_first = p.is_cuda() && p.device() == params[0].device() && p.scalar_type() == type &&
                                      p.layout() == at::kStrided && p.is_non_overlapping_and_dense();
    if (!dense_like_the_first || !same_layout(p, grads[i]) || !same_layout(p, exp_avgs[i]) ||
        !same_layout(p, exp_avg_sqs[i]))
      return false;
    if (!max_exp_avg_sqs.empty() && !same_layout(p, max_exp_avg_sqs[i])) return false;
  }
  return true;
}

void fused_adamw_chunked(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                         const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                         const std::vector<at::Tensor>& max_exp_avg_sqs, const std::vector<at::Tensor>& steps,
                         const at::Tensor& lr_on_device, const AdamWHyper& h,
                         const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& found_inf) {
  if (params.empty()) return;
  c10::cuda::CUDAGuard guard(params[0].device());
  std::vector<int64_t> numels;
  for (const auto& p : params) numels.push_back(p.numel());
  const int64_t chunk_size = adamw_chunk_size(numels);
  const float* lr_ptr = lr_on_device.defined() ? lr_on_device.const_data_ptr<float>() : nullptr;
  const float* grad_scale_ptr = grad_scale ? grad_scale->const_data_ptr<float>() : nullptr;
  const float* found_inf_ptr = found_inf ? found_inf->const_data_ptr<float>() : nullptr;
  // With a device rate PyTorch passes lr = 1.0, unused; so do we.
  const double lr = lr_ptr ? 1.0 : h.lr;
  const bool maximize = false;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, params[0].scalar_type(), "amplab_fused_adamw", [&] {
    if (h.amsgrad) {
      launch_chunked<5>({params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs}, steps, chunk_size,
                        FusedAdamMathFunctor<scalar_t, 5, ADAM_MODE::ADAMW, true>(), lr_ptr, lr, h.beta1, h.beta2,
                        h.weight_decay, h.eps, maximize, grad_scale_ptr, found_inf_ptr);
    } else {
      launch_chunked<4>({params, grads, exp_avgs, exp_avg_sqs}, steps, chunk_size,
                        FusedAdamMathFunctor<scalar_t, 4, ADAM_MODE::ADAMW, false>(), lr_ptr, lr, h.beta1, h.beta2,
                        h.weight_decay, h.eps, maximize, grad_scale_ptr, found_inf_ptr);
    }
  });
}

}  // namespace amplab::cuda
