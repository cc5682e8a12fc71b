// TrainingSnapshot (training_snapshot.hpp): host copies of the training state, put back on demand.
#include "given/training_snapshot.hpp"

#include <ATen/Context.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>  // other optimizers' state, through their own save/load

#include <algorithm>
#include <mutex>
#include <sstream>

#include "amplab/infra/error.hpp"

namespace memory_optimization {

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
    throw amplab::Error("TrainingSnapshot::restore: the model's parameters or buffers changed since the snapshot");
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

}  // namespace memory_optimization
