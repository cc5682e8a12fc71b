// Lab 8: sharded data parallelism, ZeRO stages 1, 2 and 3 (labs/sharded_training/README.md has
// the theory).
//
// DDP (lab 5) keeps the whole model, its whole gradient and the whole optimizer state on every
// rank: W copies of everything. ZeRO-1 keeps one copy of the optimizer state, cut in W pieces:
//
//   flat buffer   [ p0 p0 p0 | p1 p1 ... p1 | p2 ... p2 | pad ]   every parameter back to back,
//                 [ shard 0   | shard 1     | shard 2   ...  ]   cut into W equal shards
//
// Rank r holds AdamW's two moments for shard r only. After backward the gradients are
// reduce-scattered (rank r gets the mean over the ranks of shard r's gradients), each rank steps
// its own shard of the parameters, and an all-gather brings every rank the others' updated shards.
// Every rank ends the step with the same parameters, as under DDP, having held 1/W of the state.
//
// ZeRO-2 shards the gradients too. The parameters come in buckets (one per layer, say), each
// with a flat buffer of its own cut in W shards as above. When backward has produced the last
// gradient of a bucket, the bucket's gradients are reduce-scattered at once, while backward goes
// on with the layers before it (lab 5's overlap), and the whole gradients are freed: between two
// steps a rank holds only its shard of each bucket's gradient.
//
// ZeRO-3 (FSDP) shards the parameters too. Between two uses a rank holds only its shard of each
// unit (a layer, a transformer block). A unit's forward all-gathers its whole parameters,
// computes, and lets them go. Its backward gathers them again, computes the gradients, and
// reduce-scatters them to the shards. While one unit computes, the next one's all-gather is
// already on its way (a prefetch).
//
//   flat_layout           where each parameter sits and how the buffer is cut      (TODO sharded_training-1)
//   adamw_shard_step      AdamW on one shard                                       (TODO sharded_training-2)
//   ShardedAdamW          ZeRO-1's step: reduce-scatter, AdamW on a shard, all-gather (TODO sharded_training-2)
//   estimate_memory       bytes per rank of each part of the training state        (TODO sharded_training-3)
//   ShardedGradientsAdamW ZeRO-2: each bucket reduce-scattered as backward finishes it (TODO sharded_training-4)
//   FullyShardedModel     ZeRO-3: each unit gathered for its forward and backward, then freed (TODO sharded_training-5)
//   save_sharded, load_sharded  ZeRO-3's checkpoint: each rank writes and reads its own shards (TODO sharded_training-6)
//   load_resharded        that checkpoint loaded on another number of ranks             (TODO sharded_training-7)
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "amplab/dist/communicator.hpp"
#include "models.hpp"

namespace zero_lab {

// Where each parameter lives in one flat buffer, and how that buffer is cut into shards.
struct FlatLayout {
  std::vector<int64_t> offsets;  // parameter i's first element in the flat buffer
  int64_t numel = 0;             // the parameters' elements, all together (no padding)
  int64_t shard_numel = 0;       // each rank's shard; the buffer holds world_size * shard_numel
  int world_size = 1;

  int64_t padded_numel() const { return shard_numel * world_size; }
  int64_t shard_begin(int rank) const { return rank * shard_numel; }
};

// TODO(sharded_training-1): the layout of `params` (their order kept) in a flat buffer cut into `world_size`
// equal shards.
FlatLayout flat_layout(const std::vector<torch::Tensor>& params, int world_size);

struct AdamWOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
};

// TODO(sharded_training-2): one AdamW step (torch.optim.AdamW's, decoupled weight decay) of one
// shard, in place: `param_shard` and the moments `exp_avg`, `exp_avg_sq` are updated with
// `grad_shard`; `step` counts the steps taken including this one (1 at the first).
void adamw_shard_step(torch::Tensor& param_shard, const torch::Tensor& grad_shard, torch::Tensor& exp_avg,
                      torch::Tensor& exp_avg_sq, int64_t step, const AdamWOptions& options);

// AdamW over parameters sharded ZeRO-1's way. The constructor (given: labs/sharded_training/given/) moves the
// parameters into one flat fp32 buffer laid out by flat_layout: each parameter and its .grad
// become views of flat_params() and flat_grads(), so backward writes every gradient into the flat
// buffer. It allocates this rank's optimizer state: two moments of shard_numel elements each.
// Every rank must pass the same parameters with the same values (broadcast them first).
class ShardedAdamW {
 public:
  ShardedAdamW(std::vector<torch::Tensor> params, std::shared_ptr<amplab::dist::Communicator> comm,
               AdamWOptions options);

  // TODO(sharded_training-2): one AdamW step of this rank's shard, with every rank's gradients averaged, then
  // every rank gets every shard.
  void step();

  void zero_grad() { flat_grads_.zero_(); }  // in place: the .grad views stay views
  const FlatLayout& layout() const { return layout_; }
  const torch::Tensor& flat_params() const { return flat_params_; }
  const torch::Tensor& flat_grads() const { return flat_grads_; }
  // This rank's shard of the averaged gradient, as the last step() used it (a view of
  // flat_grads(): the next zero_grad() clears it).
  const torch::Tensor& grad_shard() const { return grad_shard_; }
  int64_t steps() const { return steps_; }
  // The optimizer state this rank holds, in bytes (the two moments of its shard).
  int64_t state_bytes() const { return exp_avg_.nbytes() + exp_avg_sq_.nbytes(); }

 private:
  std::vector<torch::Tensor> params_;
  std::shared_ptr<amplab::dist::Communicator> comm_;
  AdamWOptions options_;
  FlatLayout layout_;
  torch::Tensor flat_params_, flat_grads_;  // padded_numel() elements each, the padding zero
  torch::Tensor grad_shard_;                // this rank's shard of flat_grads_ (a view): its averaged gradient
  torch::Tensor exp_avg_, exp_avg_sq_;      // shard_numel elements each: AdamW's moments
  int64_t steps_ = 0;                       // steps taken (AdamW's bias correction counts them)
};

// AdamW over parameters and gradients sharded ZeRO-2's way, bucket by bucket. The constructor
// (given: labs/sharded_training/given/) lays each bucket out with flat_layout: its parameters
// become views of the bucket's flat_params, and each gets a hook that calls gradient_ready(b)
// once autograd has accumulated its gradient into .grad. It allocates this rank's shard of each
// bucket's gradient and moments. The hooks run on autograd's thread while backward goes on.
// Rules: every rank passes the same buckets with the same values; backward must finish the
// buckets in the same order on every rank (it does for one model), since their reduce-scatters
// are issued in that order; every parameter gets a gradient in every backward.
class ShardedGradientsAdamW {
 public:
  struct Bucket {
    std::vector<torch::Tensor> params;
    FlatLayout layout;
    torch::Tensor flat_params;             // padded_numel() elements: the parameters are views of it
    torch::Tensor grad_shard;              // shard_numel elements: the mean gradient of this rank's shard
    torch::Tensor exp_avg, exp_avg_sq;     // shard_numel elements each: AdamW's moments
    size_t pending = 0;                    // gradients of this backward still to come
    std::shared_ptr<amplab::dist::Work> reduce_scatter;  // the bucket's reduce-scatter in flight, or null
  };

  ShardedGradientsAdamW(std::vector<std::vector<torch::Tensor>> buckets,
                        std::shared_ptr<amplab::dist::Communicator> comm, AdamWOptions options);
  ~ShardedGradientsAdamW();  // removes the hooks
  ShardedGradientsAdamW(const ShardedGradientsAdamW&) = delete;
  ShardedGradientsAdamW& operator=(const ShardedGradientsAdamW&) = delete;

  // TODO(sharded_training-4): called by parameter p's hook once backward has accumulated p's
  // gradient into p.grad(); p is one of bucket `bucket`'s parameters. When it is the bucket's
  // last, starts the bucket's reduce-scatter and frees the bucket's whole gradients.
  void gradient_ready(size_t bucket);
  // TODO(sharded_training-4): after backward: every bucket's averaged gradient shard, AdamW on
  // this rank's shard of each bucket, and every rank gets every bucket's updated parameters.
  void step();

  // Given: a new backward starts (the gradients were freed by the last one's reduce-scatters).
  void zero_grad();
  const std::vector<Bucket>& buckets() const { return buckets_; }
  int64_t steps() const { return steps_; }
  // What this rank holds between steps, in bytes: the moments, and the gradient shards.
  int64_t state_bytes() const;
  int64_t gradient_bytes() const;

 private:
  std::vector<Bucket> buckets_;
  std::shared_ptr<amplab::dist::Communicator> comm_;
  AdamWOptions options_;
  std::mutex mutex_;   // gradient_ready may run on autograd's threads (one per device)
  int64_t steps_ = 0;  // steps taken (AdamW's bias correction counts them)
};

// FSDP's mixed precision (PyTorch's MixedPrecisionPolicy): the shards, the moments and the step
// stay fp32; the all-gathers and the layers' compute run in param_dtype; the gradients are
// reduce-scattered in reduce_dtype (fp32 sums more exactly; bf16 moves half the bytes).
struct ShardedPrecision {
  torch::ScalarType param_dtype = torch::kFloat32, reduce_dtype = torch::kFloat32;
};

// ZeRO-3 (FSDP) for a LabModel (models.hpp): each of the model's units (a Linear of the MLP, a
// block of the GPT) keeps its parameters only as this rank's shard of one flat buffer
// [p0 | p1 | ... | padding] laid out by flat_layout. The unit's parameters themselves stay in the
// model, as views of a whole buffer (`whole`) whose memory exists only while the unit is gathered:
// the rest of the time it holds no bytes, as FSDP2 frees an unsharded parameter's storage. The
// model's forward runs each unit's part through run_unit (given), which calls your four moments
// around it: before_forward and after_forward around the part, before_backward when backward
// reaches the part's output, after_backward once backward has accumulated every one of the unit's
// gradients. The constructor, run_unit, the gathers' memory and the collectives are given
// (labs/sharded_training/given/fully_sharded_model.cpp); the moments, prefetch, unshard and the
// step are yours (fully_sharded.cpp). Every rank must pass the same model with the same values.
class FullyShardedModel {
 public:
  struct Unit {
    std::shared_ptr<torch::nn::Module> module;
    std::vector<torch::Tensor> params;  // the module's parameters, views of `whole`, in layout order
    FlatLayout layout;
    bool reshard_after_forward = true;  // false for a unit used twice in forward (the GPT's ends)
    torch::Tensor shard;       // shard_numel elements, fp32: this rank's shard of the parameters
    torch::Tensor grad_shard;  // shard_numel elements in reduce_dtype: this rank's shard of the mean gradient
    std::shared_ptr<amplab::dist::Work> reducing;  // the reduce-scatter into grad_shard in flight, or null
    torch::Tensor exp_avg, exp_avg_sq;  // shard_numel elements each: AdamW's moments
    torch::Tensor whole;  // padded_numel() elements in param_dtype while gathered (or being gathered),
                          // no memory otherwise: the parameters are views of it
    bool gathered = false;                          // whole holds the gathered parameters
    std::shared_ptr<amplab::dist::Work> gathering;  // whole's all-gather in flight (a prefetch), or null
    size_t gradients_pending = 0;                   // of this backward, the parameters still without a gradient
  };

  FullyShardedModel(std::shared_ptr<LabModel> model, std::shared_ptr<amplab::dist::Communicator> comm,
                    AdamWOptions options, bool prefetch = true, ShardedPrecision precision = {});
  ~FullyShardedModel();  // removes the gradient hooks
  FullyShardedModel(const FullyShardedModel&) = delete;
  FullyShardedModel& operator=(const FullyShardedModel&) = delete;

  // Given: the model's output, each unit's part through run_unit; the input is cast to
  // param_dtype first when it is floating, and the output back to fp32 (FSDP casts at the root).
  torch::Tensor forward(const torch::Tensor& input);
  torch::Tensor loss(const torch::Tensor& output, const torch::Tensor& target) const { return model_->loss(output, target); }
  // Given: before_forward(u), part(), after_forward(u), and a hook on the part's output that
  // calls before_backward(u) when backward reaches it. Checks that the unit is gathered where it
  // must be (an amplab::Error naming the moment otherwise).
  torch::Tensor run_unit(size_t u, const std::function<torch::Tensor()>& part);

  // TODO(sharded_training-5): FSDP's four moments of unit u, and what they need.
  void before_forward(size_t u);
  void after_forward(size_t u);
  void before_backward(size_t u);
  void after_backward(size_t u);
  // TODO(sharded_training-5): starts unit u's all-gather (start_gather) and returns at once;
  // nothing when u is out of range, prefetching is off, or the unit is gathered or being gathered.
  void prefetch(size_t u);
  // TODO(sharded_training-5): unit u gathered: waits for its prefetch, or gathers now.
  void unshard(size_t u);
  // TODO(sharded_training-5): AdamW on every unit's shard with its grad_shard.
  void step();

  // Given: gives unit u's whole buffer its memory and starts the all-gather of every rank's shard
  // into it (in param_dtype); unit.gathering is that Work.
  void start_gather(size_t u);
  // Given: unit u's whole buffer lets its memory go (the parameters keep their shapes, no bytes).
  void reshard(size_t u);
  // Given: starts the reduce-scatter of this rank's whole gradient of unit u (padded_numel()
  // elements laid out as the parameters, in any floating dtype: it travels in reduce_dtype) into
  // the unit's grad_shard, the mean over the ranks, and returns at once (step() waits for it).
  void reduce_scatter_gradient(size_t u, const torch::Tensor& whole_gradient);

  void zero_grad();  // given: forgets the last backward's reduce-scatter (each overwrites its grad_shard)
  // Given, a collective: every parameter whole, flat and in the units' order (for checks).
  torch::Tensor full_parameters();
  std::vector<Unit>& units() { return units_; }
  LabModel& model() { return *model_; }
  amplab::dist::Communicator& communicator() { return *comm_; }
  const ShardedPrecision& precision() const { return precision_; }
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }  // a checkpoint's count, when one is loaded
  int64_t state_bytes() const;  // the moments

 private:
  std::shared_ptr<LabModel> model_;
  std::vector<Unit> units_;
  std::shared_ptr<amplab::dist::Communicator> comm_;
  AdamWOptions options_;
  bool prefetch_ = true;
  ShardedPrecision precision_;
  int64_t steps_ = 0;
  std::shared_ptr<amplab::dist::Work> last_reducing_;  // the last reduce-scatter started (step() waits for it)

  void gradient_accumulated(size_t u);  // a parameter hook's: after_backward once the last one came
};

// TODO(sharded_training-6): a sharded checkpoint of `model` in directory `dir` (it exists):
// each rank writes only what it holds, its units' shards and moments and the step count, to a
// safetensors file of its own, and returns once every rank's file is complete.
void save_sharded(FullyShardedModel& model, const std::string& dir);
// TODO(sharded_training-6): the training state save_sharded wrote, each rank reading its own
// file. A checkpoint of another world size, or a file that does not fit the model, is an
// amplab::Error naming the file and what differs, and leaves the model as it was.
void load_sharded(FullyShardedModel& model, const std::string& dir);
// TODO(sharded_training-7): the same training state, saved by save_sharded on any number of ranks,
// loaded into `model` on this job's number of ranks (re-sharding): this rank's shard of every
// unit, and of its moments, cut again from the saved shards. A checkpoint with a rank's file
// missing, or a unit that does not fit the model, is an amplab::Error naming the file, and leaves
// the model as it was.
void load_resharded(FullyShardedModel& model, const std::string& dir);

// Bytes one rank holds of each part of the training state of a model of `num_params`
// parameters trained with AdamW on `world_size` ranks.
struct MemoryEstimate {
  int64_t parameters = 0, gradients = 0, optimizer_state = 0;
  int64_t total() const { return parameters + gradients + optimizer_state; }
};

// TODO(sharded_training-3): the bytes per rank of the parameters, gradients and optimizer state under ZeRO
// stage `stage` (0: DDP, 1: optimizer state sharded, 2: gradients too, 3: parameters too), in
// fp32 or in mixed precision (bf16 parameters and gradients, fp32 master weights and moments).
MemoryEstimate estimate_memory(int64_t num_params, int world_size, int stage, bool mixed_precision);

}  // namespace zero_lab
