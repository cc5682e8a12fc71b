// Given code of the MNIST lab (no TODOs here): the loss, the modes, evaluation. The network is
// amplab::MnistNet (src/amplab/models/models.hpp).
#include "mnist.hpp"

#include <cstdlib>

#include "amplab/infra/log.hpp"

namespace mnist {

torch::Tensor nll_loss(Net& net, const amplab::Batch& batch) {
  return torch::nll_loss(net->forward(batch.input), batch.target);
}

std::string Mode::label() const {
  return kind == "gpu-amp" ? kind + " (" + amplab::to_string(precision) + ")" : kind;
}

std::vector<Mode> expand_modes(const std::vector<std::string>& kinds, const std::vector<std::string>& amp_precisions) {
  std::vector<Mode> modes;
  for (const auto& kind : kinds) {
    if (kind != "gpu-amp") {
      modes.push_back({kind, amplab::Precision::fp32});
      continue;
    }
    for (const auto& name : amp_precisions)
      modes.push_back({kind, amplab::enum_from_string<amplab::Precision>(name, "mnist.amp_precisions")});
  }
  return modes;
}

Evaluation evaluate(Net& net, const ResidentSplit& split, int64_t batch_size, amplab::Precision precision) {
  torch::NoGradGuard no_grad;
  net->eval();
  torch::Device device = split.images.device();
  torch::Tensor correct = torch::zeros({}, torch::dtype(torch::kInt64).device(device));
  torch::Tensor loss_sum = torch::zeros({}, torch::dtype(torch::kFloat64).device(device));
  {
    amplab::AutocastGuard autocast(device, precision);
    for (int64_t start = 0; start < split.size(); start += batch_size) {
      int64_t n = std::min(batch_size, split.size() - start);
      torch::Tensor output = net->forward(split.images.narrow(0, start, n));
      torch::Tensor labels = split.labels.narrow(0, start, n);
      loss_sum += torch::nll_loss(output.to(torch::kFloat32), labels, {}, at::Reduction::Sum).to(torch::kFloat64);
      correct += output.argmax(1).eq(labels).sum();
    }
  }
  net->train();
  // One host sync for the whole evaluation.
  auto totals = torch::stack({correct.to(torch::kFloat64), loss_sum}).cpu();
  double n = static_cast<double>(split.size());
  return {totals[0].item<double>() / n, totals[1].item<double>() / n};
}

namespace {

// mnist.loader=pinned: each batch gathered in host memory, copied into pinned memory and from there
// to the device on the current (compute) stream without blocking the host. (pageable is
// amplab::TensorBatches over host tensors.) The caching host allocator keeps a pinned block until
// the copy queued from it has finished.
class PinnedBatches : public amplab::BatchSource {
 public:
  PinnedBatches(torch::Tensor inputs, torch::Tensor targets, amplab::EpochSampler sampler, torch::Device device,
                std::function<torch::Tensor(const torch::Tensor&)> layout)
      : inputs_(std::move(inputs)),
        targets_(std::move(targets)),
        sampler_(std::move(sampler)),
        device_(device),
        layout_(std::move(layout)) {}
  void set_epoch(int64_t epoch) override { sampler_.set_epoch(epoch); }
  int64_t batches_per_epoch() const override { return sampler_.batches_per_epoch(); }
  int64_t dataset_size() const override { return inputs_.size(0); }
  int64_t batch_rows(int64_t index) override { return sampler_.batch_indices(index).size(0); }
  amplab::Batch batch(int64_t index) override {
    torch::Tensor idx = sampler_.batch_indices(index);
    torch::Tensor input = inputs_.index_select(0, idx), target = targets_.index_select(0, idx);
    if (device_.is_cuda()) {
      input = input.pin_memory();
      target = target.pin_memory();
    }
    input = input.to(device_, /*non_blocking=*/true);
    return {layout_ ? layout_(input) : input, target.to(device_, /*non_blocking=*/true)};
  }

 private:
  torch::Tensor inputs_, targets_;
  amplab::EpochSampler sampler_;
  torch::Device device_;
  std::function<torch::Tensor(const torch::Tensor&)> layout_;
};

}  // namespace

std::unique_ptr<amplab::BatchSource> make_train_batches(const std::string& loader, const amplab::MnistSplit& split,
                                                        const torch::Tensor& resident_images,
                                                        const torch::Tensor& resident_labels,
                                                        amplab::EpochSampler sampler, torch::Device device,
                                                        bool channels_last) {
  if (loader == "resident")
    return std::make_unique<amplab::TensorBatches>(resident_images, resident_labels, std::move(sampler), device);
  std::function<torch::Tensor(const torch::Tensor&)> layout;
  if (channels_last) layout = [](const torch::Tensor& t) { return t.contiguous(torch::MemoryFormat::ChannelsLast); };
  torch::Tensor host_images = amplab::normalize_images(split.images);
  if (loader == "pageable" || loader == "pinned") {
    amplab::log::info("loader: " + loader + " (mnist.loader): the training images in host memory, each batch copied " +
                      (loader == "pinned" ? "from pinned memory, without blocking the host," : "from pageable memory") +
                      " on the compute stream to " + device.str());
    if (loader == "pageable")
      return std::make_unique<amplab::TensorBatches>(host_images, split.labels, std::move(sampler), device, std::move(layout));
    return std::make_unique<PinnedBatches>(host_images, split.labels, std::move(sampler), device, std::move(layout));
  }
  amplab::log::info("loader: prefetch (mnist.loader): the training images in host memory, each batch through "
                    "pinned memory and a side stream to " + device.str());
  return std::make_unique<PrefetchingBatches>(host_images, split.labels, std::move(sampler), device, std::move(layout));
}

}  // namespace mnist
