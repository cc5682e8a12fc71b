#include "amplab/activation_checkpoint.hpp"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <torch/csrc/autograd/autograd.h>         // torch::autograd::grad
#include <torch/csrc/autograd/custom_function.h>  // torch::autograd::Function

#include <algorithm>
#include <mutex>
#include <utility>

#include "amplab/error.hpp"
#include "amplab/precision.hpp"

namespace amplab {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// torch's generators for the CPU and for each GPU the segment touches.
struct RngStates {
  torch::Tensor cpu;                                               // mt19937 state (CPU byte tensor)
  std::vector<std::pair<c10::DeviceIndex, torch::Tensor>> cuda;  // Philox seed + offset per GPU

  static RngStates capture(const std::vector<c10::DeviceIndex>& cuda_devices) {
    RngStates s;
    s.cpu = get(c10::Device(c10::kCPU));
    for (auto index : cuda_devices) s.cuda.emplace_back(index, get(c10::Device(c10::kCUDA, index)));
    return s;
  }
  void apply() const {
    set(c10::Device(c10::kCPU), cpu);
    for (const auto& [index, state] : cuda) set(c10::Device(c10::kCUDA, index), state);
  }

 private:
  static torch::Tensor get(c10::Device device) {
    at::Generator gen = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    return gen.get_state();
  }
  static void set(c10::Device device, const torch::Tensor& state) {
    at::Generator gen = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  }
};

// Sets the forward's generator states for its lifetime, then puts back the states found
// (torch.random.fork_rng): the recomputation draws the forward's numbers and leaves no trace.
class RngFork {
 public:
  explicit RngFork(const RngStates& forward_states) {
    std::vector<c10::DeviceIndex> devices;
    for (const auto& entry : forward_states.cuda) devices.push_back(entry.first);
    outside_ = RngStates::capture(devices);
    forward_states.apply();
  }
  ~RngFork() { outside_.apply(); }
  RngFork(const RngFork&) = delete;
  RngFork& operator=(const RngFork&) = delete;

 private:
  RngStates outside_;
};

// Autocast as the forward saw it, for both device types a segment may run on.
struct AutocastState {
  bool cpu_enabled = false;
  c10::ScalarType cpu_dtype = c10::kBFloat16;
  bool cuda_enabled = false;
  c10::ScalarType cuda_dtype = c10::kHalf;
  bool cache_enabled = true;

  static AutocastState capture() {
    AutocastState s;
    s.cpu_enabled = at::autocast::is_autocast_enabled(c10::kCPU);
    s.cpu_dtype = at::autocast::get_autocast_dtype(c10::kCPU);
    s.cuda_enabled = at::autocast::is_autocast_enabled(c10::kCUDA);
    s.cuda_dtype = at::autocast::get_autocast_dtype(c10::kCUDA);
    s.cache_enabled = at::autocast::is_autocast_cache_enabled();
    return s;
  }
};

// What backward needs besides the saved tensors; kept in the context as a capsule.
struct CheckpointState : torch::CustomClassHolder {
  SegmentFn segment;
  size_t num_inputs = 0;                 // the Function's tensors: inputs first, then parameters
  std::vector<bool> input_requires_grad; // per input, at forward time
  bool preserve_rng = true;
  RngStates rng;                         // before the forward ran
  AutocastState autocast;                // while the forward ran
};

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  // tensors: the segment's inputs, then its parameters (inputs of the Function only so that their
  // gradients are routed to their AccumulateGrad nodes; see the header).
  static variable_list forward(AutogradContext* ctx, at::TensorList tensors, c10::intrusive_ptr<CheckpointState> state) {
    std::vector<torch::Tensor> inputs(tensors.begin(), tensors.begin() + static_cast<int64_t>(state->num_inputs));
    if (state->preserve_rng) {
      std::vector<c10::DeviceIndex> devices;
      for (const auto& t : tensors)
        if (t.is_cuda() && std::find(devices.begin(), devices.end(), t.device().index()) == devices.end())
          devices.push_back(t.device().index());
      state->rng = RngStates::capture(devices);
    }
    state->autocast = AutocastState::capture();
    variable_list outputs;
    {
      torch::NoGradGuard no_grad;  // (apply() already disabled grad mode: said here because it is the point)
      outputs = state->segment(inputs);
    }
    for (size_t i = 0; i < outputs.size(); ++i)
      if (!outputs[i].defined()) throw Error("checkpoint: the segment's output " + std::to_string(i) + " is undefined");
    ctx->save_for_backward(variable_list(tensors.begin(), tensors.end()));  // inputs: the only activations kept
    ctx->set_materialize_grads(false);  // an unused output gets no gradient, rather than zeros to backpropagate
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto state = c10::static_intrusive_pointer_cast<CheckpointState>(ctx->saved_data["state"].toCapsule());
    const variable_list saved = ctx->get_saved_variables();
    const size_t n = state->num_inputs;

    // Fresh leaves for the inputs (gradients stop here and are returned); the parameters are used
    // as they are, and autograd::grad below returns their gradients without accumulating them.
    std::vector<torch::Tensor> inputs(n), targets;
    std::vector<size_t> target_index;  // position of each target among the Function's tensors
    for (size_t i = 0; i < n; ++i) {
      inputs[i] = saved[i].detach();
      if (state->input_requires_grad[i] && ctx->needs_input_grad(i)) {
        inputs[i].requires_grad_(true);
        targets.push_back(inputs[i]);
        target_index.push_back(i);
      }
    }
    for (size_t i = n; i < saved.size(); ++i) {
      if (saved[i].requires_grad() && ctx->needs_input_grad(i)) {
        targets.push_back(saved[i]);
        target_index.push_back(i);
      }
    }

    // The recomputation, under the forward's random numbers and autocast state.
    variable_list outputs;
    {
      std::optional<RngFork> rng;
      if (state->preserve_rng) rng.emplace(state->rng);
      const AutocastState& a = state->autocast;
      AutocastGuard cpu_autocast(c10::kCPU, a.cpu_dtype, a.cpu_enabled, a.cache_enabled);
      AutocastGuard cuda_autocast(c10::kCUDA, a.cuda_dtype, a.cuda_enabled, a.cache_enabled);
      torch::AutoGradMode grad_mode(true);
      outputs = state->segment(inputs);
    }

    variable_list result(saved.size() + 1);  // one per tensor, then none for the state argument
    variable_list differentiable, grads;
    for (size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i) {
      if (outputs[i].requires_grad() && grad_outputs[i].defined()) {
        differentiable.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    if (targets.empty() || differentiable.empty()) return result;
    variable_list target_grads = torch::autograd::grad(differentiable, targets, grads, /*retain_graph=*/false,
                                                       /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t k = 0; k < targets.size(); ++k) result[target_index[k]] = target_grads[k];
    return result;
  }
};

}  // namespace

std::vector<torch::Tensor> checkpoint_tensors(const SegmentFn& segment, const std::vector<torch::Tensor>& inputs,
                                              const std::vector<torch::Tensor>& parameters,
                                              const CheckpointOptions& options) {
  std::vector<torch::Tensor> tensors;
  bool any_requires_grad = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) throw Error("checkpoint: input " + std::to_string(i) + " is undefined");
    any_requires_grad = any_requires_grad || inputs[i].requires_grad();
    tensors.push_back(inputs[i]);
  }
  for (const auto& p : parameters) {
    if (!p.defined()) continue;
    any_requires_grad = any_requires_grad || p.requires_grad();
    tensors.push_back(p);
  }
  // Nothing to differentiate (evaluation, frozen segment): no graph either way, just run it.
  if (!torch::GradMode::is_enabled() || !any_requires_grad) return segment(inputs);

  auto state = c10::make_intrusive<CheckpointState>();
  state->segment = segment;
  state->num_inputs = inputs.size();
  for (const auto& x : inputs) state->input_requires_grad.push_back(x.requires_grad());
  state->preserve_rng = options.preserve_rng_state;
  return CheckpointFunction::apply(at::TensorList(tensors), state);
}

torch::Tensor checkpoint(const std::function<torch::Tensor(const torch::Tensor&)>& segment, const torch::Tensor& input,
                         const std::vector<torch::Tensor>& parameters, const CheckpointOptions& options) {
  SegmentFn many = [segment](const std::vector<torch::Tensor>& xs) { return std::vector<torch::Tensor>{segment(xs[0])}; };
  return checkpoint_tensors(many, {input}, parameters, options)[0];
}

torch::Tensor checkpoint_sequential(const torch::nn::Sequential& sequential, const torch::Tensor& input, int64_t every,
                                    const CheckpointOptions& options) {
  std::shared_ptr<torch::nn::SequentialImpl> blocks = sequential.ptr();
  const auto size = static_cast<int64_t>(blocks->size());
  auto run = [blocks](int64_t begin, int64_t end, torch::Tensor x) {
    for (int64_t i = begin; i < end; ++i) x = (blocks->begin() + i)->forward(x);
    return x;
  };
  if (every <= 0) return run(0, size, input);
  torch::Tensor x = input;
  int64_t begin = 0;
  for (; begin + every < size; begin += every) {  // every segment but the last
    const int64_t end = begin + every;
    std::vector<torch::Tensor> parameters;
    for (int64_t i = begin; i < end; ++i)
      for (const auto& p : (blocks->begin() + i)->ptr()->parameters()) parameters.push_back(p);
    x = checkpoint([run, begin, end](const torch::Tensor& t) { return run(begin, end, t); }, x, parameters, options);
  }
  return run(begin, size, x);  // the last segment keeps its activations: its backward comes first
}

}  // namespace amplab
