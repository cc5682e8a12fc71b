// The trainer: what one optimizer step works on (model, loss, optimizer, loss scaler, memory
// tracker, gradient sync), and Trainer::step, which runs one. The step itself (forward under
// autocast, scaled backward, unscale, clip, step or skip, update) is lab 2's, gradient accumulation
// lab 3's: plain functions step.hpp declares and those labs define, chosen when the binary is
// linked; the trainer never includes a lab. The loop around the step is loop.hpp's.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "amplab/data/batches.hpp"
#include "amplab/infra/config.hpp"
#include "amplab/train/loss_scaler.hpp"
#include "amplab/measure/memory.hpp"
#include "amplab/train/precision.hpp"

namespace amplab {

struct OptimizerConfig {
  std::string name = "sgd";
  double lr = 0.01;
  double momentum = 0.0;
  double weight_decay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  std::string schedule = "constant";
  double warmup = 0.0;

  template <class V>
  void fields(V& v) {
    v.choice("name", name, {"sgd", "adam", "adamw"}, "optimizer");
    v.field("lr", lr, "learning rate", Range<double>::positive());
    v.field("momentum", momentum, "SGD momentum (sgd only)", Range<double>::between(0, 1));
    v.field("weight_decay", weight_decay, "weight decay: an L2 penalty (sgd, adam) or decoupled decay (adamw)",
            Range<double>::at_least(0));
    v.field("beta1", beta1, "Adam beta1 (adam, adamw)", Range<double>::between(0, 1));
    v.field("beta2", beta2, "Adam beta2 (adam, adamw)", Range<double>::between(0, 1));
    v.field("eps", eps, "Adam epsilon (adam, adamw)", Range<double>::positive());
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

// torch::optim's SGD, Adam or AdamW as `config` says: the trainer's optimizer without the fast path.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<torch::Tensor>& parameters,
                                                        const OptimizerConfig& config);
// The options make_optimizer gives SGD and AdamW (the fast path's fused ones take the same).
torch::optim::SGDOptions sgd_options(const OptimizerConfig& config);
torch::optim::AdamWOptions adamw_options(const OptimizerConfig& config);

// train.fast_path's description, the one for every lab's config that has the key (TrainConfig's,
// and those labs whose train: section is a struct of their own).
inline constexpr const char* kFastPathDescription =
    "our fast path as a whole: the fused network where the lab has one (our CUDA kernels), PyTorch's fused "
    "SGD/AdamW (sgd and adamw only), and on a GPU each step replayed as one CUDA graph where the lab replays; "
    "false: the textbook network, torch's optimizers, eager steps";

// The settings of the step itself, which every row of a lab shares: a lab whose rows each pick
// their own precision and loss scaling declares its train: section as these alone, and makes each
// row's TrainConfig with for_row(), so that a key added here reaches every row. A lab with another
// default clip gives it where it declares the section:
//   amplab::StepSettings train{/*grad_clip_norm=*/1.0};
struct TrainConfig;
struct StepSettings {
  explicit StepSettings(double default_grad_clip_norm = 0.0) : grad_clip_norm(default_grad_clip_norm) {}
  double grad_clip_norm;
  bool fast_path = false;
  OptimizerConfig optimizer;
  GradScalerConfig grad_scaler;

  // A row's trainer config: these settings, with the row's precision and loss scaling.
  TrainConfig for_row(Precision precision, const std::string& loss_scaling) const;

  template <class V>
  void fields(V& v) {
    v.field("grad_clip_norm", grad_clip_norm, "clip the global gradient 2-norm to this (0: off)",
            Range<double>::at_least(0));
    v.field("fast_path", fast_path, kFastPathDescription);
    v.section("optimizer", optimizer);
    v.section("grad_scaler", grad_scaler);
  }
};

// The train: section of a lab that trains through the core's loop: the step's settings and the run's.
struct TrainConfig : StepSettings {
  int epochs = 1;
  int64_t batch_size = 64;
  int accumulation_steps = 1;
  Precision precision = Precision::fp32;
  std::string loss_scaling = "auto";
  int64_t log_every = 50;
  int64_t max_steps = 0;
  bool drop_last = false;
  int divergence_patience = 10;
  double min_loss_scale = 1.0 / 1024;
  bool progress = true;
  bool trace_steps = false;

  template <class V>
  void fields(V& v) {
    v.field("epochs", epochs, "passes over the training set", Range<int64_t>::at_least(1));
    v.field("batch_size", batch_size, "samples per micro-batch (per process in DDP)", Range<int64_t>::at_least(1));
    v.field("accumulation_steps", accumulation_steps, "micro-batches per optimizer step", Range<int64_t>::at_least(1));
    v.field("precision", precision, "numeric precision");
    v.choice("loss_scaling", loss_scaling, {"auto", "on", "off"}, "GradScaler: auto = only for fp16-mixed");
    v.field("log_every", log_every, "optimizer steps between log lines (each costs a host sync)",
            Range<int64_t>::at_least(1));
    v.field("max_steps", max_steps, "stop after this many optimizer steps in total (0: no limit)",
            Range<int64_t>::at_least(0));
    v.field("drop_last", drop_last, "skip the last, smaller batch of each epoch");
    v.field("divergence_patience", divergence_patience,
            "consecutive non-finite losses before stopping (fp32, bf16; fp16 has min_loss_scale)",
            Range<int64_t>::at_least(1));
    v.field("min_loss_scale", min_loss_scale, "fp16: stop when the loss scale falls below this", Range<double>::positive());
    v.field("progress", progress, "progress bar with ETA on interactive terminals");
    v.field("trace_steps", trace_steps,
            "write a profiler trace of 5 optimizer steps after the first 10 (or the first half of a shorter run) into "
            "trace-<row>.json in the run directory, for ui.perfetto.dev (a traced run's timings carry the profiler's "
            "overhead)");
    StepSettings::fields(v);
  }
};

inline TrainConfig StepSettings::for_row(Precision precision, const std::string& loss_scaling) const {
  TrainConfig row;
  static_cast<StepSettings&>(row) = *this;
  row.precision = precision;
  row.loss_scaling = loss_scaling;
  return row;
}

// Makes the trainer's optimizer for `parameters`. Without one the trainer uses make_optimizer and
// refuses train.fast_path: the fast path's fused optimizers come from src/amplab/fast/fast_path.hpp
// (make_fast_path_optimizer), which a program that offers the key hands the Trainer.
using OptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(const std::vector<torch::Tensor>&, const TrainConfig&)>;

// Inputs and targets of one micro-batch, on the training device.
// Forward pass plus loss: what a lab supplies. Runs under the autocast guard.
using LossFn = std::function<torch::Tensor(const Batch&)>;

// The micro-batches of one optimizer step: how many, the rows of each (known without making
// it), and each batch, made when asked (so that one micro-batch's tensors live at a time).
struct MicroBatches {
  int64_t count = 0;
  std::function<int64_t(int64_t)> rows;
  std::function<Batch(int64_t)> batch;
};

// Data-parallel training plugs in here (lab 5's gradient synchronization, labs/ddp): the trainer
// tells it which backward passes must all-reduce, and waits for the reduction before the optimizer
// step. No agreement on the GradScaler's found_inf is needed: the gradients are averaged before it
// looks at them, so every rank sees the same ones and skips or steps with the others.
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
          const MemoryConfig& memory = {}, const OptimizerFactory& make_optimizer = {});

  // One optimizer step over one batch, or over a group of micro-batches (accumulation).
  StepResult step(const Batch& batch);
  StepResult step(const MicroBatches& group);

  // ---- For the mechanisms: what a step works with ----
  // The loss of `batch` (call it under the autocast guard). Also marks the forward and backward
  // phases for the memory tracker, and tells data-parallel training that a backward is coming
  // (last_micro_batch: whether the gradients are to be all-reduced after it).
  torch::Tensor forward_loss(const Batch& batch, bool last_micro_batch = true);
  // Call once backward is done, before touching gradients: waits for data-parallel training to
  // average them across ranks (a no-op in one process) and marks the optimizer phase.
  void gradients_ready();

  torch::nn::Module& model() { return *model_; }
  const std::vector<torch::Tensor>& parameters() const { return parameters_; }  // model().parameters()
  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  LossScaler& scaler() { return *scaler_; }
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

 private:
  void enter(Phase phase);
  bool steps_each_bucket();  // see step(): DDP may update each bucket as soon as it is reduced
  StepResult finish_step(StepResult result);

  std::shared_ptr<torch::nn::Module> model_;
  LossFn loss_fn_;
  TrainConfig config_;
  torch::Device device_;
  std::vector<torch::Tensor> parameters_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<LossScaler> scaler_;
  MemoryTracker memory_;
  Tf32Guard tf32_;  // TF32 only for precision tf32 (fp32 means IEEE fp32 matmuls and convolutions)
  GradientSync* sync_ = nullptr;
  std::optional<bool> step_each_bucket_;  // decided at the first synchronized step
  Phase phase_ = Phase::other;
  int64_t global_step_ = 0;
};

}  // namespace amplab
