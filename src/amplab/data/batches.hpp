// Batches and where they come from: the Batch a step trains on, the BatchSource interface the
// loop and the CUDA-graph step read, and TensorBatches (samples held in tensors).
#pragma once

#include <torch/types.h>

#include <functional>
#include <utility>

#include "amplab/data/sampler.hpp"

namespace amplab {

// One batch of inputs and targets.
struct Batch {
  torch::Tensor input;
  torch::Tensor target;
  int64_t size() const { return input.size(0); }
};

// Where batches come from.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual void set_epoch(int64_t epoch) = 0;   // reshuffle for this epoch
  virtual int64_t batches_per_epoch() const = 0;
  virtual int64_t dataset_size() const { return -1; }  // samples in the whole set (-1: unknown)
  virtual Batch batch(int64_t index) = 0;      // on the training device
  virtual int64_t batch_rows(int64_t index) { return batch(index).size(); }
  // Writes batch `index` into existing tensors of the same shape (what a CUDA graph reads).
  virtual void batch_into(int64_t index, Batch& into) {
    Batch b = batch(index);
    into.input.copy_(b.input);
    into.target.copy_(b.target);
  }
};

// A batch already made, as a BatchSource of one batch (for a step that reads a BatchSource, like
// the CUDA-graph step, fed by a loop that samples its own batches).
class ReadyBatch : public BatchSource {
 public:
  explicit ReadyBatch(Batch batch) : batch_(std::move(batch)) {}
  void set_epoch(int64_t) override {}
  int64_t batches_per_epoch() const override { return 1; }
  Batch batch(int64_t) override { return batch_; }
  int64_t batch_rows(int64_t) override { return batch_.size(); }

 private:
  Batch batch_;
};

// Samples held in tensors (on the CPU or already on the device), batched by an EpochSampler.
// `transform` turns a gathered input batch into the model's input (e.g. uint8 -> normalised float).
// The epoch's order is copied next to the data once per epoch, so that gathering a batch is
// device work only: no host-to-device copy per step (from pageable memory that would make the
// host wait for the GPU every step).
class TensorBatches : public BatchSource {
 public:
  TensorBatches(torch::Tensor inputs, torch::Tensor targets, EpochSampler sampler, torch::Device device,
                std::function<torch::Tensor(const torch::Tensor&)> transform = nullptr);
  void set_epoch(int64_t epoch) override;
  int64_t batches_per_epoch() const override { return sampler_.batches_per_epoch(); }
  int64_t dataset_size() const override { return inputs_.size(0); }
  Batch batch(int64_t index) override;
  int64_t batch_rows(int64_t index) override { return indices(index).size(0); }
  void batch_into(int64_t index, Batch& into) override;
  const EpochSampler& sampler() const { return sampler_; }

 private:
  torch::Tensor inputs_, targets_;
  EpochSampler sampler_;
  torch::Tensor order_;  // this rank's epoch order, on the inputs' device
  torch::Tensor indices(int64_t index);
  torch::Device device_;
  std::function<torch::Tensor(const torch::Tensor&)> transform_;
};

}  // namespace amplab
