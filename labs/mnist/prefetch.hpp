// Lab 4, TODO mnist-6: host batches through pinned memory, copied to the GPU on a side stream
// while the previous step computes (solution in prefetch.cpp). The lab's GPU modes keep the whole
// dataset on the device (TensorBatches over ResidentSplit); this is the path most training takes
// instead, and --set mnist.loader=prefetch trains through it.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>

#include "amplab/data/batches.hpp"
#include "amplab/data/mnist.hpp"
#include "amplab/data/sampler.hpp"

namespace mnist {

// TODO(mnist-6): the batches TensorBatches gives for the same inputs, targets, sampler and
// transform, in the same order, but the data stays in host memory: batch i+1 is gathered into a
// pinned buffer and copied to `device` on a side stream while batch i is being trained on. On the
// CPU it gathers, as TensorBatches does.
class PrefetchingBatches : public amplab::BatchSource {
 public:
  // `inputs` and `targets` on the CPU; `transform` runs on `device` after the copy.
  PrefetchingBatches(torch::Tensor inputs, torch::Tensor targets, amplab::EpochSampler sampler, torch::Device device,
                     std::function<torch::Tensor(const torch::Tensor&)> transform = nullptr);
  ~PrefetchingBatches() override;
  PrefetchingBatches(const PrefetchingBatches&) = delete;
  PrefetchingBatches& operator=(const PrefetchingBatches&) = delete;

  void set_epoch(int64_t epoch) override;
  int64_t batches_per_epoch() const override { return sampler_.batches_per_epoch(); }
  int64_t dataset_size() const override { return inputs_.size(0); }
  // Batch `index` of this epoch, ready to be read on the device's current stream. Any index in
  // any order; batch index+1 is prefetched.
  amplab::Batch batch(int64_t index) override;
  int64_t batch_rows(int64_t index) override { return sampler_.batch_indices(index).size(0); }
  const amplab::EpochSampler& sampler() const { return sampler_; }

 private:
  struct Slot;      // one pinned buffer and the batch copied out of it (prefetch.cpp)
  struct Pipeline;  // the side stream and two slots; null on the CPU

  // Gathers batch `index` into the slot's pinned buffer and queues its copy to the device.
  void start_copy(int64_t index, Slot& slot);
  // Hands the slot's batch to the current stream.
  amplab::Batch take(Slot& slot);
  amplab::Batch gather_on_the_cpu(int64_t index);

  torch::Tensor inputs_, targets_;
  amplab::EpochSampler sampler_;
  torch::Device device_;
  std::function<torch::Tensor(const torch::Tensor&)> transform_;
  std::unique_ptr<Pipeline> pipeline_;
};

// Given: the lab binary's training batches. `loader` (mnist.loader) picks them: "resident" (the
// default) gathers from `resident`, the dataset already on the device; the others keep `split` in
// host memory and gather each batch there: "pageable" copies it from ordinary memory on the
// compute stream (the host waits for the copy), "pinned" copies it from a pinned buffer without
// blocking the host (still on the compute stream: the step waits for it), "prefetch" through a
// PrefetchingBatches. `channels_last` gives the host batches the resident ones' layout.
std::unique_ptr<amplab::BatchSource> make_train_batches(const std::string& loader, const amplab::MnistSplit& split,
                                                        const torch::Tensor& resident_images,
                                                        const torch::Tensor& resident_labels,
                                                        amplab::EpochSampler sampler, torch::Device device,
                                                        bool channels_last);

}  // namespace mnist
