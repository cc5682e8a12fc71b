// Lab 4, MNIST end to end. Each TODO below is one exercise; see labs/mnist/README.md.
#include "mnist.hpp"

#include "amplab/data/mnist.hpp"
#include "amplab/infra/device.hpp"
#include "amplab/train/precision.hpp"

namespace mnist {

torch::Device device_for(const Mode& mode) {
  // TODO(mnist-1): "cpu" trains on the CPU; every other mode on the first GPU (cuda:0). Then
  // implement place_model() and batch_to_device() below.
  // BEGIN SOLUTION
  return mode.needs_gpu() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  // END SOLUTION
}

void place_model(Net& net, torch::Device device) {
  // TODO(mnist-1): Move every parameter and buffer of `net` to `device`, then check with
  // amplab::check_on_device that nothing stayed behind (it throws naming what did).
  // BEGIN SOLUTION
  net->to(device);
  amplab::check_on_device(*net, device);
  // END SOLUTION
}

amplab::Batch batch_to_device(const amplab::Batch& batch, torch::Device device) {
  // TODO(mnist-1): Return the batch's input and target on `device`. A copy from the host can be
  // asynchronous (non_blocking) when the host memory is pinned.
  // BEGIN SOLUTION
  return {batch.input.to(device, /*non_blocking=*/true), batch.target.to(device, /*non_blocking=*/true)};
  // END SOLUTION
}

ResidentSplit make_resident(const amplab::MnistSplit& split, torch::Device device, bool channels_last) {
  ResidentSplit out;
  // TODO(mnist-2): Copy the uint8 images to the device first (4x fewer bytes to move than
  // floats), normalise them there with amplab::normalize_images (-> (N, 1, 28, 28) float32), and
  // when `channels_last` convert to torch::MemoryFormat::ChannelsLast (cuDNN's fastest layout for
  // convolutions). Labels go to the device as they are (int64).
  // BEGIN SOLUTION
  out.images = amplab::normalize_images(split.images.to(device));
  if (channels_last) out.images = out.images.contiguous(torch::MemoryFormat::ChannelsLast);
  out.labels = split.labels.to(device);
  // END SOLUTION
  return out;
}

amplab::TrainConfig train_config_for(const Mode& mode, const amplab::TrainConfig& base) {
  amplab::TrainConfig config = base;
  // TODO(mnist-3): Set config.precision to the mode's precision and check with
  // amplab::check_supported that its device can run it. The core does the rest: autocast for
  // the forward pass, a GradScaler for fp16-mixed only (loss_scaling "auto"). Our fast path (our
  // CUDA kernels, CUDA graphs) is for GPUs: turn config.fast_path off for the cpu mode.
  // BEGIN SOLUTION
  config.precision = mode.precision;
  amplab::check_supported(config.precision, device_for(mode));
  if (!mode.needs_gpu()) config.fast_path = false;
  // END SOLUTION
  return config;
}

MemoryUse memory_use(const amplab::MemoryTracker& tracker) {
  MemoryUse use;
  // TODO(mnist-4): The tracker's peak of each phase (forward, backward, optimizer), in MiB (2^20
  // bytes; the tracker counts bytes), and the peak of the whole step. Say what the numbers are:
  // `source` names where they come from (see MemoryUse in mnist.hpp): on the CPU the tracker reads
  // the process's resident memory, which counts everything the process holds, on a GPU the CUDA
  // caching allocator's bytes held by tensors (amplab::memory_is_rss tells which).
  // BEGIN SOLUTION
  auto mib = [](int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); };
  use.forward_mib = mib(tracker.phase_peak(amplab::Phase::forward));
  use.backward_mib = mib(tracker.phase_peak(amplab::Phase::backward));
  use.optimizer_mib = mib(tracker.phase_peak(amplab::Phase::optimizer));
  use.peak_mib = std::max({use.forward_mib, use.backward_mib, use.optimizer_mib});
  use.source = amplab::memory_is_rss(tracker.device()) ? "cpu_rss" : "cuda_allocator";
  // END SOLUTION
  return use;
}

std::vector<ModeResult> run_benchmark(const std::vector<Mode>& modes, bool gpu_available, const RunMode& run_mode) {
  std::vector<ModeResult> results;
  // TODO(mnist-5): Run every mode in order with run_mode(mode) and collect the results. A mode
  // that needs a GPU where there is none is not run: record it with ran = false and
  // skipped_because saying so. Then, if the cpu mode ran, set each result's speedup_vs_cpu to the
  // cpu seconds_per_epoch divided by its own.
  // BEGIN SOLUTION
  for (const Mode& mode : modes) {
    if (mode.needs_gpu() && !gpu_available) {
      ModeResult skipped;
      skipped.mode = mode.label();
      skipped.skipped_because = "no CUDA device is available; run on a GPU machine for this mode";
      results.push_back(skipped);
      continue;
    }
    results.push_back(run_mode(mode));
  }
  const ModeResult* cpu = nullptr;
  for (const auto& r : results)
    if (r.mode == "cpu" && r.ran) cpu = &r;
  if (cpu) {
    double cpu_seconds = cpu->seconds_per_epoch;
    for (auto& r : results)
      if (r.ran && r.seconds_per_epoch > 0) r.speedup_vs_cpu = cpu_seconds / r.seconds_per_epoch;
  }
  // END SOLUTION
  return results;
}

}  // namespace mnist
