// The training step. Trainer::step() is the one function that reads top to bottom: forward
// under autocast, scaled backward per micro-batch, then unscale, clip, step-or-skip, update.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "amplab/config.hpp"
#include "amplab/grad_scaler.hpp"
#include "amplab/memory.hpp"
#include "amplab/precision.hpp"

namespace amplab {

struct OptimizerConfig {
  std::string name = "sgd";   // sgd | adam | adamw
  double lr = 0.01;           // learning rate
  double momentum = 0.0;      // sgd only
  double weight_decay = 0.0;  // L2 penalty (sgd, adam) or decoupled decay (adamw)
  double beta1 = 0.9;         // adam/adamw
  double beta2 = 0.999;       // adam/adamw
  double eps = 1e-8;          // adam/adamw
  bool fused = false;         // sgd, adamw: PyTorch's fused kernel (one launch; device-side fp16 skip)
  std::string schedule = "constant";  // constant | linear: lr falls linearly towards 0 over the run's steps
  double warmup = 0.0;        // fraction of the run's steps over which lr first rises linearly from 0

  template <class V>
  void fields(V& v) {
    v.choice("name", name, {"sgd", "adam", "adamw"}, "optimizer");
    v.field("lr", lr, "learning rate", Range<double>::positive());
    v.field("momentum", momentum, "SGD momentum", Range<double>::between(0, 1));
    v.field("weight_decay", weight_decay, "weight decay", Range<double>::at_least(0));
    v.field("beta1", beta1, "Adam beta1", Range<double>::between(0, 1));
    v.field("beta2", beta2, "Adam beta2", Range<double>::between(0, 1));
    v.field("eps", eps, "Adam epsilon", Range<double>::positive());
    v.field("fused", fused, "sgd, adamw: one fused kernel for all parameters (CUDA graphs need it for fp16, adamw, schedules)");
    v.choice("schedule", schedule, {"constant", "linear"},
             "learning rate per step after the warm-up: constant, or linear = falling to 0 at the end of the run");
    v.field("warmup", warmup, "fraction of the run's steps over which the rate rises linearly from 0 first",
            Range<double>::between(0, 0.5));
  }
};

// The learning rate of optimizer step `step` (0-based) of a run of `total_steps` steps, as
// PyTorch's LambdaLR with the lambda of Hugging Face's get_linear_schedule_with_warmup: with
// W = floor(warmup * total_steps) warm-up steps, lr * step / W before step W; after it
// lr * (total_steps - step) / (total_steps - W) for "linear", lr for "constant".
double scheduled_lr(const OptimizerConfig& config, int64_t step, int64_t total_steps);
// Whether the rate changes during the run (a linear schedule or a warm-up).
bool has_schedule(const OptimizerConfig& config);

// Sets the learning rate of every parameter group; a FusedOptimizer also updates its device copy,
// which a captured CUDA graph reads.
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<torch::Tensor>& parameters,
                                                        const OptimizerConfig& config);

struct TrainConfig {
  int epochs = 1;                       // passes over the training set
  int64_t batch_size = 64;              // samples per micro-batch (per process in DDP)
  int accumulation_steps = 1;           // micro-batches per optimizer step
  Precision precision = Precision::fp32;
  std::string loss_scaling = "auto";    // auto (fp16-mixed only) | on | off
  double grad_clip_norm = 0.0;          // clip the global gradient 2-norm to this (0: off)
  int64_t log_every = 50;               // optimizer steps between log lines (each costs a host sync)
  int64_t max_steps = 0;                // stop after this many optimizer steps in total (0: no limit)
  bool drop_last = false;               // skip the last, smaller batch of an epoch
  bool cuda_graph = false;              // capture the whole step as one CUDA graph (cuda_graph.hpp)
  int divergence_patience = 10;         // stop after this many consecutive non-finite losses (fp32/bf16)
  double min_loss_scale = 1.0 / 1024;   // fp16: stop when the loss scale falls below this
  bool progress = true;                 // progress bar with ETA on interactive terminals
  OptimizerConfig optimizer;
  GradScalerConfig grad_scaler;         // used when loss scaling is on

  template <class V>
  void fields(V& v) {
    v.field("epochs", epochs, "passes over the training set", Range<int64_t>::at_least(1));
    v.field("batch_size", batch_size, "samples per micro-batch (per process)", Range<int64_t>::at_least(1));
    v.field("accumulation_steps", accumulation_steps, "micro-batches per optimizer step", Range<int64_t>::at_least(1));
    v.field("precision", precision, "numeric precision");
    v.choice("loss_scaling", loss_scaling, {"auto", "on", "off"}, "GradScaler: auto = only for fp16-mixed");
    v.field("grad_clip_norm", grad_clip_norm, "clip the gradient 2-norm to this (0: off)", Range<double>::at_least(0));
    v.field("log_every", log_every, "optimizer steps between log lines", Range<int64_t>::at_least(1));
    v.field("max_steps", max_steps, "stop after this many optimizer steps (0: no limit)", Range<int64_t>::at_least(0));
    v.field("drop_last", drop_last, "skip the last, smaller batch of each epoch");
    v.field("cuda_graph", cuda_graph, "replay the whole step as one CUDA graph (GPU; accumulation_steps 1)");
    v.field("divergence_patience", divergence_patience, "consecutive non-finite losses before stopping",
            Range<int64_t>::at_least(1));
    v.field("min_loss_scale", min_loss_scale, "fp16: stop when the loss scale falls below this", Range<double>::positive());
    v.field("progress", progress, "progress bar on interactive terminals");
    v.section("optimizer", optimizer);
    v.section("grad_scaler", grad_scaler);
  }
};

// Inputs and targets of one micro-batch, on the training device.
struct Batch {
  torch::Tensor input;
  torch::Tensor target;
  int64_t size() const { return input.size(0); }
};

// Forward pass plus loss: what a lab supplies. Runs under the autocast guard.
using LossFn = std::function<torch::Tensor(const Batch&)>;

// Data-parallel training plugs in here (dist/ddp.hpp): the trainer tells it which backward
// passes must all-reduce, and waits for the reduction before the optimizer step.
class GradientSync {
 public:
  virtual ~GradientSync() = default;
  virtual void before_forward() {}                       // e.g. broadcast buffers from rank 0
  // Between forward and backward; `loss` is the micro-batch's loss (its graph is what backward
  // runs); reduce_after_this is false inside an accumulation group.
  virtual void before_backward(const torch::Tensor& loss, bool reduce_after_this) = 0;
  virtual void finish() = 0;                             // wait for all-reduces; grads averaged
  // Whether finish_stepping_each_bucket may update `params` (the optimizer's): all of them are
  // reduced in buckets, and the user has not turned it off.
  virtual bool can_step_each_bucket(const std::vector<torch::Tensor>& /*params*/) { return false; }
  // finish(), but calling step_bucket(parameters) for each bucket as soon as its gradients are
  // averaged, so that updating early buckets overlaps the all-reduce of later ones. Called only
  // when can_step_each_bucket said yes.
  virtual void finish_stepping_each_bucket(const std::function<void(const std::vector<torch::Tensor>&)>& step_bucket) = 0;
};

struct StepResult {
  torch::Tensor loss;       // mean loss over the group's micro-batches (0-dim, on the device, no sync)
  torch::Tensor grad_norm;  // total gradient norm before clipping (undefined when not clipping)
  torch::Tensor skipped;    // 0-dim float: 1 when the GradScaler skipped the step (undefined without loss scaling)
  int64_t samples = 0;
};

class Trainer {
 public:
  Trainer(std::shared_ptr<torch::nn::Module> model, LossFn loss_fn, const TrainConfig& config, torch::Device device,
          const MemoryConfig& memory = {});

  // One optimizer step over `group_size` micro-batches; micro_batch(i) returns the i-th.
  StepResult step(int64_t group_size, const std::function<Batch(int64_t)>& micro_batch);

  torch::nn::Module& model() { return *model_; }
  const std::shared_ptr<torch::nn::Module>& model_ptr() const { return model_; }
  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  GradScaler& scaler() { return scaler_; }
  MemoryTracker& memory() { return memory_; }
  const TrainConfig& config() const { return config_; }
  torch::Device device() const { return device_; }
  Precision precision() const { return config_.precision; }
  int64_t global_step() const { return global_step_; }  // optimizer steps taken (skipped ones too)
  void set_global_step(int64_t step) { global_step_ = step; }
  Phase current_phase() const { return phase_; }
  void set_gradient_sync(GradientSync* sync) {
    sync_ = sync;
    step_each_bucket_.reset();
  }
  // Autocast keeps fp16/bf16 copies of weights for the forward pass; a CUDA graph capture must not
  // (cuda_graph.cpp turns it off while capturing).
  void set_autocast_cache(bool enabled) { autocast_cache_ = enabled; }

 private:
  void enter(Phase phase);
  bool steps_each_bucket();  // see step(): DDP may update each bucket as soon as it is reduced

  std::shared_ptr<torch::nn::Module> model_;
  LossFn loss_fn_;
  TrainConfig config_;
  torch::Device device_;
  std::vector<torch::Tensor> parameters_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  GradScaler scaler_;
  MemoryTracker memory_;
  Tf32Guard tf32_;  // TF32 only for precision tf32 (fp32 means IEEE fp32 matmuls and convolutions)
  GradientSync* sync_ = nullptr;
  std::optional<bool> step_each_bucket_;  // decided at the first synchronized step
  Phase phase_ = Phase::other;
  bool autocast_cache_ = true;
  int64_t global_step_ = 0;
};

}  // namespace amplab
