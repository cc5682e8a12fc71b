// The lab's two workloads, given (workloads.hpp).
#include "workloads.hpp"

#include <ATen/autocast_mode.h>

#include "amplab/models/models.hpp"
#include "amplab/models/small_cnn.hpp"
#include "amplab/models/wide_mlp.hpp"
#include "amplab/train/precision.hpp"

namespace amp_training {
namespace {

void make_mlp_workload(Workload& w, const MlpConfig& c, torch::Device device) {
  amplab::WideMlp net(c.width, c.layers);
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
  w.flops_per_step = amplab::wide_mlp_step_flops(c.batch, c.width, c.layers);
  w.shape = std::to_string(c.layers) + " x Linear(" + std::to_string(c.width) + ", " + std::to_string(c.width) +
            "), batch " + std::to_string(c.batch);
}

void make_cnn_workload(Workload& w, const CnnConfig& c, torch::Device device) {
  amplab::SmallCnn net(c.channels, c.classes);
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

}  // namespace amp_training
