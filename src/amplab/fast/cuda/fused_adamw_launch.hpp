// PyTorch's fused AdamW kernel, launched with chunks sized to the parameters.
//
// at::_fused_adamw_ runs PyTorch's FusedAdamMathFunctor over fixed 65536-element chunks, one
// thread block each. A model of 1.2 M parameters (the MNIST network) is then 20 blocks: 20 of
// an H200's 132 SMs work and the update takes 50 us. This launcher runs the same functor (the
// header ships in the torch wheel, so the arithmetic is PyTorch's, to the bit) over chunks small
// enough to give every SM work: as small as 2048 elements, as long as one launch holds them all.
// Big models keep PyTorch's 65536.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

namespace amplab::cuda {

struct AdamWHyper {
  double lr = 1e-3;  // used when lr_on_device is undefined
  double beta1 = 0.9, beta2 = 0.999, weight_decay = 1e-2, eps = 1e-8;
  bool amsgrad = false;
};

// Whether fused_adamw_chunked can take these lists: CUDA tensors on one device, one floating
// dtype, each state tensor laid out like its parameter. Otherwise call at::_fused_adamw_.
bool can_run_fused_adamw_chunked(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                                 const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                                 const std::vector<at::Tensor>& max_exp_avg_sqs);

// at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, ...) with
// maximize=false, the same results; the step counts are float32 0-dim tensors, already advanced.
void fused_adamw_chunked(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                         const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                         const std::vector<at::Tensor>& max_exp_avg_sqs, const std::vector<at::Tensor>& steps,
                         const at::Tensor& lr_on_device, const AdamWHyper& hyper,
                         const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& found_inf);

// The chunk length the launcher picks for tensors of these sizes (exposed for tests).
int64_t adamw_chunk_size(const std::vector<int64_t>& numels);

}  // namespace amplab::cuda
