// Lab 4, MNIST end to end: the functions you implement (starter/mnist/mnist.cpp, and the
// prefetching loader of prefetch.hpp in starter/mnist/prefetch.cpp). The lab binary (apps/mnist)
// trains the same network on the CPU, on the GPU in fp32 and with mixed precision, and compares
// them; tests/labs/mnist_test.cpp grades your functions.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "amplab/data/mnist.hpp"
#include "amplab/infra/error.hpp"  // AMPLAB_TODO in the starter
#include "amplab/measure/memory.hpp"
#include "amplab/models/models.hpp"
#include "amplab/train/precision.hpp"
#include "amplab/train/trainer.hpp"
#include "prefetch.hpp"

namespace mnist {

// Given: the network of pytorch/examples' mnist/main.py (src/amplab/models/models.hpp). Input
// (N, 1, 28, 28), output (N, 10) log-probabilities.
using Net = amplab::MnistNet;

// Given: negative log-likelihood of the batch's labels under the network (the training loss).
torch::Tensor nll_loss(Net& net, const amplab::Batch& batch);

// One way of training: "cpu" (fp32), "gpu" (fp32) or "gpu-amp" with fp16-mixed or bf16-mixed.
struct Mode {
  std::string kind;                            // cpu | gpu | gpu-amp
  amplab::Precision precision = amplab::Precision::fp32;
  std::string label() const;                   // "cpu", "gpu", "gpu-amp (bf16-mixed)"
  bool needs_gpu() const { return kind != "cpu"; }
};
// Given: the modes a config asks for, in order ("gpu-amp" once per AMP precision).
std::vector<Mode> expand_modes(const std::vector<std::string>& kinds, const std::vector<std::string>& amp_precisions);

// TODO(mnist-1): where a mode runs, and getting the model and the batches there.
torch::Device device_for(const Mode& mode);
void place_model(Net& net, torch::Device device);
amplab::Batch batch_to_device(const amplab::Batch& batch, torch::Device device);

// TODO(mnist-2): the whole dataset, normalised, on the training device (60000 x 784 floats are
// 188 MB: nothing next to a GPU's memory, and no copy per batch after that).
struct ResidentSplit {
  torch::Tensor images;  // (N, 1, 28, 28) float32, normalised like pytorch/examples, on the device
  torch::Tensor labels;  // (N) int64, on the device
  int64_t size() const { return labels.size(0); }
};
ResidentSplit make_resident(const amplab::MnistSplit& split, torch::Device device, bool channels_last);

// TODO(mnist-3): mixed precision through the core: the trainer config of a mode.
amplab::TrainConfig train_config_for(const Mode& mode, const amplab::TrainConfig& base);

// TODO(mnist-4): memory of a training run, from the core's memory tracker.
struct MemoryUse {
  double forward_mib = 0;    // peak during the forward phases
  double backward_mib = 0;   // peak during the backward phases
  double optimizer_mib = 0;  // peak during the optimizer steps
  double peak_mib = 0;       // the largest of the three
  std::string source;        // "cuda_allocator" (bytes held by tensors) or "cpu_rss" (process RSS)
};
MemoryUse memory_use(const amplab::MemoryTracker& tracker);

// TODO(mnist-5): the benchmark across modes.
struct ModeResult {
  std::string mode;                   // Mode::label()
  bool ran = false;
  std::string skipped_because;        // why it did not run ("" when it ran)
  std::vector<double> epoch_seconds;  // training time per epoch
  std::vector<double> train_loss;     // per epoch
  std::vector<double> test_accuracy;  // per epoch
  double seconds_per_epoch = 0;       // the last (warm) epoch
  double samples_per_second = 0;      // of the last epoch
  double speedup_vs_cpu = 0;          // cpu seconds_per_epoch / this one's (0 when cpu did not run)
  MemoryUse memory;
};
using RunMode = std::function<ModeResult(const Mode&)>;
std::vector<ModeResult> run_benchmark(const std::vector<Mode>& modes, bool gpu_available, const RunMode& run_mode);

// Given: accuracy and mean loss on a resident split, in batches, without gradients.
struct Evaluation {
  double accuracy = 0;
  double loss = 0;
};
Evaluation evaluate(Net& net, const ResidentSplit& split, int64_t batch_size, amplab::Precision precision);

}  // namespace mnist
