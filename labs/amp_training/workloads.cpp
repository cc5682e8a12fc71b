// The lab's two workloads, given (workloads.hpp).
#include "workloads.hpp"

#include <ATen/autocast_mode.h>

#include "amplab/infra/device.hpp"
#include "amplab/infra/log.hpp"
#include "amplab/measure/memory.hpp"
#include "amplab/models/models.hpp"
#include "small_cnn.hpp"
#include "wide_mlp.hpp"
#include "amplab/train/precision.hpp"

namespace amp_training {
namespace {

void make_mlp_workload(Workload& w, const MlpConfig& c, torch::Device device) {
  WideMlp net(c.width, c.layers);
  w.model = net.ptr();
  w.batch = {torch::randn({c.batch, c.width}, device), torch::randn({c.batch, c.width}, device)};
  // The benchmark times the step, so its loss is the cheapest that trains every layer: the sum
  // of the outputs over the batch size, read once and accumulated in fp32 with autocast off
  // (under autocast a reduction first writes an fp32 copy of the whole (B, width) output, and a
  // squared error against a target reads another 256 MiB). dL/dy = 1/B stays in fp16's normal
  // range. The Python reference (bench/mlp_step_parts.py) times the same loss.
  w.loss_fn = [net, batch = c.batch, device](const amplab::Batch& b) mutable {
    torch::Tensor out = net->forward(b.input);
    amplab::AutocastGuard off(device.type(), at::autocast::get_autocast_dtype(device.type()), /*enabled=*/false);
    return out.sum(torch::kFloat32) / static_cast<double>(batch);
  };
  w.flops_per_step = wide_mlp_step_flops(c.batch, c.width, c.layers);
  w.shape = std::to_string(c.layers) + " x Linear(" + std::to_string(c.width) + ", " + std::to_string(c.width) +
            "), batch " + std::to_string(c.batch);
}

void make_cnn_workload(Workload& w, const CnnConfig& c, torch::Device device) {
  SmallCnn net(c.channels, c.classes);
  w.model = net.ptr();
  auto images = torch::randn({c.batch, 3, c.image_size, c.image_size}, device);
  if (c.channels_last) images = images.contiguous(torch::MemoryFormat::ChannelsLast);
  w.batch = {images, torch::randint(0, c.classes, {c.batch}, torch::TensorOptions().dtype(torch::kInt64).device(device))};
  w.loss_fn = [net](const amplab::Batch& b) mutable {
    return torch::nn::functional::cross_entropy(net->forward(b.input), b.target);
  };
  w.shape = "3 conv (" + std::to_string(c.channels) + "-" + std::to_string(4 * c.channels) + " channels) + Linear, " +
            std::to_string(c.image_size) + "x" + std::to_string(c.image_size) + " images, batch " + std::to_string(c.batch) +
            (c.channels_last ? ", channels-last" : "");
  if (c.channels_last) {
    net->to(device);
    amplab::to_channels_last(*net);
  }
}

}  // namespace

void Workload::reset() {
  torch::NoGradGuard no_grad;
  auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(initial[i]);
}

Workload make_workload(const std::string& name, const AmpLabConfig& amp, torch::Device device, uint64_t seed) {
  torch::manual_seed(seed);
  Workload w;
  w.name = name;
  if (name == "mlp") make_mlp_workload(w, amp.mlp, device);
  else make_cnn_workload(w, amp.cnn, device);
  for (const auto& p : w.model->parameters()) w.initial.push_back(p.detach().to(torch::kCPU).clone());
  w.model->to(device);
  return w;
}

PrecisionResult run_precision(Workload& w, amplab::Precision precision, bool with_scaler, const AmpConfig& config,
                              torch::Device device, const amplab::OptimizerFactory& fused_optimizer) {
  PrecisionResult r;
  r.model = w.name;
  r.precision = precision;
  r.loss_scaling = with_scaler && amplab::needs_loss_scaling(precision);
  if (!amplab::is_supported(precision, device, &r.skipped_because)) return r;
  const amplab::TrainConfig train = config.train.for_row(precision, with_scaler ? "auto" : "off");
  w.reset();
  const auto& bench = config.amp.bench;
  {
    amplab::MemoryConfig untracked;  // the step alone: no per-phase readings
    untracked.track = false;
    amplab::Trainer trainer(w.model, w.loss_fn, train, device, untracked, fused_optimizer);
    r.loss_scaling = trainer.scaler().is_enabled();
    amplab::log::info("timing " + w.name + " " + r.label());
    amplab::reset_peak_memory(device);
    torch::Tensor loss;
    for (int i = 0; i < bench.warmup; ++i) loss = trainer.step(w.batch).loss;
    amplab::synchronize(device);
    r.step_ms = amplab::summarize(
        amplab::time_back_to_back([&] { loss = trainer.step(w.batch).loss; }, device, bench.window, bench.repeats));
    r.peak_mib = static_cast<double>(amplab::read_memory(device).peak_allocated) / (1 << 20);
    r.final_loss = loss.item<double>();  // one host sync, at the end
  }  // optimizer state and the scaler go before the next precision is measured
  r.samples_per_s = static_cast<double>(w.batch.size()) / (r.step_ms.median / 1e3);
  r.tflops = w.flops_per_step / (r.step_ms.median / 1e3) / 1e12;
  return r;
}


}  // namespace amp_training
