// TensorBatches: a batch's samples gathered from tensors held in memory (batches.hpp).
#include "amplab/data/batches.hpp"

#include <torch/torch.h>

namespace amplab {

TensorBatches::TensorBatches(torch::Tensor inputs, torch::Tensor targets, EpochSampler sampler, torch::Device device,
                             std::function<torch::Tensor(const torch::Tensor&)> transform)
    : inputs_(std::move(inputs)),
      targets_(std::move(targets)),
      sampler_(std::move(sampler)),
      device_(device),
      transform_(std::move(transform)) {
  order_ = sampler_.order().to(inputs_.device());
}

void TensorBatches::set_epoch(int64_t epoch) {
  if (epoch == sampler_.epoch() && order_.defined()) return;
  sampler_.set_epoch(epoch);
  order_ = sampler_.order().to(inputs_.device());
}

torch::Tensor TensorBatches::indices(int64_t index) {
  const int64_t start = index * sampler_.batch_size();
  if (index < 0 || index >= sampler_.batches_per_epoch()) sampler_.batch_indices(index);  // throws the range error
  return order_.narrow(0, start, std::min(sampler_.batch_size(), order_.size(0) - start));
}

Batch TensorBatches::batch(int64_t index) {
  torch::Tensor idx = indices(index);
  torch::Tensor input = inputs_.index_select(0, idx).to(device_, /*non_blocking=*/true);
  torch::Tensor target = targets_.index_select(0, idx.to(targets_.device())).to(device_, /*non_blocking=*/true);
  if (transform_) input = transform_(input);
  return {input, target};
}

void TensorBatches::batch_into(int64_t index, Batch& into) {
  if (transform_ || inputs_.device() != device_ || targets_.device() != device_) return BatchSource::batch_into(index, into);
  // Gather straight into the destination: one kernel per tensor, no temporary.
  torch::Tensor idx = indices(index);
  at::index_select_out(into.input, inputs_, 0, idx);
  at::index_select_out(into.target, targets_, 0, idx);
}

}  // namespace amplab
