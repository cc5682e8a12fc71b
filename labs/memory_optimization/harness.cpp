// The model every experiment of the lab starts from (harness.hpp).
#include "harness.hpp"

#include <iostream>

#include "amplab/infra/device.hpp"
#include "amplab/measure/memory.hpp"
#include "amplab/report/table.hpp"

namespace memory_optimization {

using amplab::Precision;

Harness::Harness(const LabConfig& config, torch::Device device)
    : config(config), mem(config.mem), device(device), cpu(!device.is_cuda()),
      memory_source(amplab::memory_is_rss(device) ? "cpu_rss" : "cuda_allocator"), shape(mem.model.shape) {
  torch::manual_seed(static_cast<uint64_t>(config.run.seed));
  model = DeepMlp(shape);
  for (const auto& p : model->parameters()) {
    initial.push_back(p.detach().clone());
    parameters += p.numel();
  }
  model->to(device);
  teacher = torch::randn({shape.width, shape.classes}).to(device);
}

amplab::Trainer Harness::trainer(Precision precision, bool track) const {
  amplab::TrainConfig t = config.train.for_row(precision, "auto");
  t.progress = false;
  amplab::MemoryConfig memory;
  memory.track = track;
  return amplab::Trainer(model.ptr(), [m = model](const amplab::Batch& b) mutable { return loss_of(m, b); }, t, device,
                         memory);
}

void Harness::reset(int64_t checkpoint_every) {
  torch::NoGradGuard no_grad;
  auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(initial[i]);
  model->zero_grad(/*set_to_none=*/true);
  model->checkpoint_every = checkpoint_every;
}

void Harness::release() {
  model->zero_grad(/*set_to_none=*/true);
  amplab::free_cached_memory(device);
}

MemoryEstimate Harness::estimate(Precision precision, int64_t every) const {
  const auto& o = config.train.optimizer;
  return estimate_memory(shape, precision, every, /*momentum=*/o.name != "sgd" || o.momentum > 0);
}

FitsFn Harness::simulated_fits(Precision precision, int64_t every) const {
  if (!cpu) return {};
  return [e = estimate(precision, every), limit = mem.cap_mib * (1 << 20)](int64_t batch) {
    return static_cast<double>(e.at(batch)) <= limit;
  };
}

void Harness::set_cap(int64_t bytes) {
  if (cpu) return;
  amplab::limit_device_memory(device, bytes);
  cap_bytes = bytes;
}

void describe_setup(Harness& h, amplab::Results& results) {
  const auto& s = h.shape;
  const auto e = h.estimate(Precision::fp32, 0);
  const double cap_mib = h.mem.cap_mib;
  std::cout << "model: " << s.depth << " residual blocks x + Linear(" << s.expansion * s.width << ", " << s.width
            << ")(GELU(Linear(" << s.width << ", " << s.expansion * s.width << ")(LayerNorm(x)))), head " << s.classes
            << " classes; " << amplab::fixed(h.parameters / 1e6, 2) << " M parameters ("
            << amplab::fixed(mib(h.parameters * 4), 0) << " MiB fp32)\nestimated need, fp32: "
            << amplab::fixed(mib(e.fixed), 0) << " MiB fixed (weights, optimizer state) + the larger of "
            << amplab::fixed(mib(e.gradients), 0) << " MiB of gradients (at the optimizer step) and "
            << amplab::fixed(e.per_sample / 1024.0, 1)
            << " KiB per sample (activations, when backward starts): the activations are the larger from batch "
            << (e.per_sample > 0 ? e.gradients / e.per_sample + 1 : 0) << " up\n";
  if (h.cpu) {
    std::cout << "(CPU run: the small sizes of the config's cpu: section; memory is the process RSS and the memory "
                 "limit is simulated (" << amplab::fixed(cap_mib, 0) << " MiB of estimated need). Peak allocated vs "
                 "reserved, real out-of-memory errors,\n fp16-mixed and the memory savings need a GPU: run this on a "
                 "GPU machine for the numbers that matter.)\n";
  } else if (cap_mib > 0) {
    h.set_cap(static_cast<int64_t>(cap_mib * static_cast<double>(1 << 20)));
    std::cout << "GPU memory capped at " << amplab::fixed(cap_mib / 1024, 1) << " GiB of "
              << amplab::fixed(mib(amplab::device_total_memory(h.device)) / 1024, 1)
              << " GiB for sections 1-3 (CUDACachingAllocator::setMemoryFraction; mem.cap_mib=0 lifts it)\n";
  }
  std::cout << std::flush;
  results.set("device", amplab::describe(h.device));
  results.set("model", {{"width", s.width}, {"depth", s.depth}, {"expansion", s.expansion}, {"classes", s.classes},
                        {"dropout", s.dropout}, {"parameters", h.parameters}});
  results.set("memory_cap_gib", h.cpu ? 0.0 : cap_mib / 1024);
  results.set("memory_source", h.memory_source);
  if (h.cpu) results.set("simulated_limit_mib", cap_mib);
}

std::string setting_name(Precision precision, int64_t every) {
  return amplab::to_string(precision) + (every == 1 ? " + checkpointing" : "") +
         (every > 1 ? " + checkpointing/" + std::to_string(every) : "");
}

std::vector<Precision> supported(const Names& names, const std::string& key, torch::Device device, std::string& notes) {
  std::vector<Precision> out;
  for (const auto& name : names) {
    std::string why;
    if (amplab::is_supported(amplab::enum_from_string<Precision>(name, key), device, &why))
      out.push_back(amplab::enum_from_string<Precision>(name, key));
    else
      notes += "  " + name + ": skipped, " + why + "\n";
  }
  return out;
}

Measurement run_setting(Harness& h, Precision precision, int64_t every, int64_t batch) {
  h.reset(every);
  Measurement m;
  {
    amplab::Trainer trainer = h.trainer(precision);
    amplab::Batch data;
    m = measure([&] {
      if (!data.input.defined()) data = make_batch(batch, h.teacher, h.device);  // inside: it may not fit either
      trainer.step(data);
    }, h.device, h.mem.bench.warmup, h.mem.bench.steps);
  }
  h.release();
  return m;
}

double samples_per_second(const Measurement& m, int64_t batch) {
  return m.fits && m.step_ms > 0 ? static_cast<double>(batch) / (m.step_ms / 1e3) : 0.0;
}

}  // namespace memory_optimization
