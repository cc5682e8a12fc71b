// The model every experiment of the lab starts from (harness.hpp).
#include "harness.hpp"

#include "amplab/measure/memory.hpp"
#include "mechanisms.hpp"

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
  amplab::TrainConfig t{.precision = precision, .progress = false, .optimizer = config.train.optimizer,
                        .grad_scaler = config.train.grad_scaler};
  amplab::MemoryConfig memory;
  memory.track = track;
  return amplab::Trainer(model.ptr(), [m = model](const amplab::Batch& b) mutable { return loss_of(m, b); }, t, device,
                         amplab::course_mechanisms(), memory);
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
