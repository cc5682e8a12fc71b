#include "amplab/batch_finder.hpp"

#include <ATen/Context.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>  // other optimizers' state, through their own save/load

#include <algorithm>
#include <cmath>
#include <mutex>
#include <sstream>

#include "amplab/device.hpp"
#include "amplab/error.hpp"
#include "amplab/memory.hpp"
#include "amplab/timing.hpp"

namespace amplab {

namespace {

torch::Tensor host_copy(const torch::Tensor& t) {
  return t.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
}

torch::Tensor generator_state(c10::Device device) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_generator_state(c10::Device device, const torch::Tensor& state) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

int64_t round_up_to(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// A copy of a known per-parameter optimizer state with its tensors copied to `device`; nullptr for
// a state type not known here.
std::unique_ptr<torch::optim::OptimizerParamState> copy_state(const torch::optim::OptimizerParamState& state,
                                                              c10::Device device) {
  auto copy = [&](const torch::Tensor& t) {
    return t.defined() ? t.detach().to(device, /*non_blocking=*/false, /*copy=*/true) : t;
  };
  if (auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(&state)) {
    auto c = std::make_unique<torch::optim::SGDParamState>(*sgd);
    c->momentum_buffer(copy(sgd->momentum_buffer()));
    return c;
  }
  if (auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(&state)) {
    auto c = std::make_unique<torch::optim::AdamParamState>(*adam);
    c->exp_avg(copy(adam->exp_avg())).exp_avg_sq(copy(adam->exp_avg_sq())).max_exp_avg_sq(copy(adam->max_exp_avg_sq()));
    return c;
  }
  if (auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(&state)) {
    auto c = std::make_unique<torch::optim::AdamWParamState>(*adamw);
    c->exp_avg(copy(adamw->exp_avg())).exp_avg_sq(copy(adamw->exp_avg_sq())).max_exp_avg_sq(copy(adamw->max_exp_avg_sq()));
    return c;
  }
  return nullptr;
}

// The optimizer's parameters, in param-group order: the positions the snapshot keys state by.
std::vector<torch::Tensor> optimizer_parameters(torch::optim::Optimizer& optimizer) {
  std::vector<torch::Tensor> params;
  for (auto& group : optimizer.param_groups())
    for (auto& p : group.params()) params.push_back(p);
  return params;
}

}  // namespace

int64_t round_down_to(int64_t value, int64_t multiple) { return std::max(multiple, value / multiple * multiple); }

// ---- TrainingSnapshot -------------------------------------------------------------------------

TrainingSnapshot::TrainingSnapshot(torch::nn::Module& model, torch::optim::Optimizer* optimizer)
    : model_(model), optimizer_(optimizer) {
  torch::NoGradGuard no_grad;
  std::vector<c10::DeviceIndex> gpus;
  for (const auto& p : model_.parameters()) {
    parameters_.push_back(host_copy(p));
    grads_.push_back(p.grad().defined() ? host_copy(p.grad()) : torch::Tensor());
    if (p.is_cuda() && std::find(gpus.begin(), gpus.end(), p.device().index()) == gpus.end())
      gpus.push_back(p.device().index());
  }
  for (const auto& b : model_.buffers()) buffers_.push_back(b.defined() ? host_copy(b) : torch::Tensor());
  if (optimizer_) {
    auto params = optimizer_parameters(*optimizer_);
    auto& state = optimizer_->state();
    for (size_t i = 0; i < params.size() && !serialized_; ++i) {
      auto found = state.find(params[i].unsafeGetTensorImpl());
      if (found == state.end()) continue;
      auto copy = copy_state(*found->second, c10::Device(c10::kCPU));
      if (!copy) serialized_ = true;
      optimizer_states_.emplace_back(i, std::move(copy));
    }
    for (auto& group : optimizer_->param_groups())
      group_options_.push_back(group.has_options() ? group.options().clone() : nullptr);
    if (serialized_) {
      optimizer_states_.clear();
      torch::serialize::OutputArchive archive;
      optimizer_->save(archive);
      std::ostringstream out;
      archive.save_to(out);
      optimizer_archive_ = out.str();
    }
  }
  cpu_rng_ = generator_state(c10::Device(c10::kCPU));
  for (auto index : gpus) cuda_rng_.emplace_back(index, generator_state(c10::Device(c10::kCUDA, index)));
}

void TrainingSnapshot::restore() {
  torch::NoGradGuard no_grad;
  auto parameters = model_.parameters();
  auto buffers = model_.buffers();
  if (parameters.size() != parameters_.size() || buffers.size() != buffers_.size())
    throw Error("TrainingSnapshot::restore: the model's parameters or buffers changed since the snapshot");
  for (size_t i = 0; i < parameters.size(); ++i) {
    auto& p = parameters[i];
    p.copy_(parameters_[i]);
    if (!grads_[i].defined()) {
      p.mutable_grad() = torch::Tensor();
    } else if (p.grad().defined()) {
      p.mutable_grad().copy_(grads_[i]);
    } else {
      p.mutable_grad() = grads_[i].to(p.device(), /*non_blocking=*/false, /*copy=*/true);
    }
  }
  for (size_t i = 0; i < buffers.size(); ++i)
    if (buffers_[i].defined()) buffers[i].copy_(buffers_[i]);
  if (optimizer_) {
    // Clear first: state the trials created (momentum buffers that did not exist before) goes.
    optimizer_->state().clear();
    if (serialized_) {
      std::istringstream in(optimizer_archive_);
      torch::serialize::InputArchive archive;
      archive.load_from(in);  // tensors return to the device they were saved from
      optimizer_->load(archive);
    } else {
      auto params = optimizer_parameters(*optimizer_);
      for (const auto& [index, state] : optimizer_states_)
        optimizer_->state()[params[index].unsafeGetTensorImpl()] = copy_state(*state, params[index].device());
      auto& groups = optimizer_->param_groups();
      for (size_t g = 0; g < groups.size() && g < group_options_.size(); ++g)
        if (group_options_[g]) groups[g].set_options(group_options_[g]->clone());
    }
  }
  set_generator_state(c10::Device(c10::kCPU), cpu_rng_);
  for (const auto& [index, state] : cuda_rng_) set_generator_state(c10::Device(c10::kCUDA, index), state);
}

// ---- The search -------------------------------------------------------------------------------

std::pair<int64_t, double> best_throughput(const std::vector<BatchTrial>& trials) {
  std::pair<int64_t, double> best{0, 0.0};
  for (const auto& t : trials)
    if (t.fits && t.step_ms > 0 && t.samples_per_second > best.second) best = {t.batch, t.samples_per_second};
  return best;
}

namespace {

BatchTrial run_trial(const BatchStep& step, torch::nn::Module& model, torch::Device device, int64_t batch,
                     const BatchFinderConfig& config, const FitsFn& fits) {
  BatchTrial trial;
  trial.batch = batch;
  if (fits && !fits(batch)) {
    trial.error = "over the memory limit (injected check)";
    return trial;
  }
  trial.ran = true;
  if (config.free_cache) free_cached_memory(device);
  reset_peak_memory(device);
  const int64_t warmup = config.trial_steps > 1 ? 1 : 0;  // step 1 creates the optimizer state
  std::vector<double> ms;
  try {
    for (int64_t i = 0; i < warmup; ++i) step(batch);
    synchronize(device);
    DeviceTimer timer(device);
    for (int64_t i = warmup; i < config.trial_steps; ++i) {
      timer.start();
      step(batch);
      ms.push_back(timer.stop_ms());
    }
    trial.fits = true;
  } catch (const std::exception& e) {
    if (!is_out_of_memory(e)) throw;
    trial.error = oom_summary(e);
  }
  MemoryReading reading = read_memory(device);
  trial.peak_allocated_mib = mib(reading.peak_allocated);
  trial.peak_reserved_mib = mib(reading.peak_reserved);
  if (trial.fits) {
    trial.step_ms = summarize(ms).median;
    if (trial.step_ms > 0) trial.samples_per_second = static_cast<double>(batch) / (trial.step_ms / 1e3);
  } else {
    model.zero_grad(/*set_to_none=*/true);  // gradients half written by the failed backward
    free_cached_memory(device);             // blocks cached for the failed attempt
  }
  return trial;
}

}  // namespace

BatchSearch find_batch_size(const BatchStep& step, torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                            torch::Device device, const BatchFinderConfig& config, const FitsFn& fits) {
  if (config.start < 1 || config.multiple_of < 1 || config.max_batch < 1 || config.trial_steps < 1)
    throw Error("find_batch_size: start, multiple_of, max_batch and trial_steps must be at least 1");
  const int64_t m = config.multiple_of;
  const int64_t max_batch = round_down_to(config.max_batch, m);
  BatchSearch search;
  TrainingSnapshot snapshot(model, optimizer);
  auto attempt = [&](int64_t batch) {
    search.trials.push_back(run_trial(step, model, device, batch, config, fits));
    snapshot.restore();  // every trial starts from the state before the search
    return search.trials.back().fits;
  };
  try {
    // 1. Grow by powers of two until a batch does not fit (or max_batch fits).
    int64_t lo = 0, hi = 0;  // the largest batch that fit, the smallest that did not (0: none yet)
    for (int64_t batch = std::min(round_up_to(config.start, m), max_batch);; batch = std::min(round_up_to(2 * batch, m), max_batch)) {
      if (!attempt(batch)) {
        hi = batch;
        break;
      }
      lo = batch;
      if (batch >= max_batch) break;
    }
    // 2. Bisect between them down to the resolution.
    while (hi > 0 && hi - lo > m) {
      int64_t mid = lo + (hi - lo) / 2 / m * m;
      if (mid <= lo) mid = lo + m;
      if (mid >= hi) break;
      (attempt(mid) ? lo : hi) = mid;
    }
    search.largest_fit = lo;
    search.smallest_oom = hi;
  } catch (...) {
    snapshot.restore();
    throw;
  }
  if (search.largest_fit > 0) {
    auto with_margin = static_cast<int64_t>(std::floor(static_cast<double>(search.largest_fit) * (1.0 - config.safety_margin)));
    search.recommended = std::min(search.largest_fit, round_down_to(with_margin, m));
  }
  std::tie(search.best_throughput, search.best_samples_per_second) = best_throughput(search.trials);
  return search;
}

}  // namespace amplab
