// Data-parallel training: every rank holds the same model, trains on its own shard of each
// batch, and averages gradients with the others before the optimizer step, so all ranks take
// the same step. PyTorch's DistributedDataParallel, in C++, without the forward wrapper:
//
//   auto comm = dist::make_communicator(world, config.dist, device);
//   dist::DistributedDataParallel ddp(model, comm, config.dist);  // checks + broadcasts rank 0's weights
//   for (each step) {
//     optimizer.zero_grad();                                      // see "Where gradients live"
//     for (micro-step m of M) {
//       std::optional<dist::DistributedDataParallel::NoSync> local;
//       if (m + 1 < M) local.emplace(ddp);                         // accumulate locally, no traffic
//       ddp.before_forward();                                      // rank 0's buffers
//       auto loss = loss_fn(model->forward(x_m), y_m) / M;
//       ddp.prepare_for_backward(loss);                            // optional: see "Compression"
//       loss.backward();                                           // buckets all-reduce as grads get ready
//     }
//     ddp.finish_gradient_sync();                                  // before unscale/clip/step
//     optimizer.step();
//   }
//
// How gradients travel. Trainable parameters are grouped into buckets as PyTorch groups them:
// in reverse registration order (the order backward produces their gradients: last layer
// first), each joins the open bucket, which closes once it holds DistConfig::bucket_mb or more;
// so a parameter larger than the cap closes the bucket it joins, and a layer's bias travels with
// its weight. A PostAccumulateGradHook on each parameter marks it ready once autograd has added
// its gradient into .grad; when every parameter of a bucket is ready, and all earlier buckets
// have gone, the bucket is averaged over the ranks by one asynchronous all-reduce (one NCCL
// kernel: a second kernel per bucket would have to find free SMs between backward's matmuls
// once more, and may wait a whole matmul for them), while backward goes on computing earlier
// layers. finish_gradient_sync() sends what is left and waits for everything. With
// overlap=false all buckets go at finish time (to measure what overlap buys). Buckets always
// launch in the same order on every rank, which collectives require.
// finish_gradient_sync(after_each_bucket) also hands each bucket's parameters to a callback as
// soon as that bucket is reduced: with a fused optimizer and neither loss scaling nor clipping,
// Trainer::step updates them there (DistConfig::step_each_bucket), so the update of the early
// buckets runs while the last one (the first layer's gradient, ready only at the end of
// backward) is still on the wire. Each parameter gets the update it would get from one step
// over all of them.
//
// Where gradients live. The parameter that closes its bucket by being larger than the cap (a
// big weight), and any parameter with no other small one beside it, keeps its own .grad, which
// is all-reduced in place: autograd writes the gradient there and nothing is copied. Two or more
// smaller parameters of a bucket share its flat buffer: each .grad aliases its slice (PyTorch's
// gradient_as_bucket_view=True), and the buffer is one piece of the bucket's all-reduce. With
// zero_grad(false) autograd accumulates straight into the slice; with zero_grad()
// (set_to_none, LibTorch's default and what the trainer uses: the next backward then writes
// fresh gradients instead of adding to zeros) the hook copies each fresh gradient into its
// slice and points .grad back at it, one copy per small parameter per step
// (stats().grad_copies counts them). Do not keep references to .grad tensors across steps.

// Compression (DistConfig::compression = bf16, off by default). Gradients travel as bfloat16,
// half the bytes, with the result of PyTorch's bf16_compress_hook: each gradient rounded to bf16,
// divided by the world size, summed across ranks in bf16, and written back into .grad in the
// parameter's dtype. Under bf16 autocast a weight's gradient is computed in bf16 and only then
// cast to fp32 (the backward of autocast's cast), so rounding it back to bf16 would change
// nothing: prepare_for_backward(loss) finds such parameters (reduced in their own .grad, their
// only gradient through that cast, nothing accumulated) and DDP reduces the bf16 gradient before
// the cast, which it skips (stats().reduced_before_cast). The rest is cast to bf16 when sent. On
// NCCL the averages are written back into fp32 on a side stream as each all-reduce ends, beside
// backward (Communicator::then_copy). Not PyTorch's default: the average is rounded to bf16.
//
// Parameters that get no gradient in a step (a branch not taken on this rank) contribute zeros
// to the average; after finish_gradient_sync() every trainable parameter has a defined .grad,
// equal on all ranks, so all ranks step identically. Unlike a single process, where such a
// parameter's .grad stays undefined and the optimizer skips it, it gets a zero (or other
// ranks') gradient: with plain SGD that is the same update, with weight decay or momentum it is
// not. Freeze parameters you never train (requires_grad=false): they are not synchronized. A
// rank that leaves a parameter unused also loses the overlap for its bucket and the ones after
// (they go at finish time). The first time it happens a warning names the parameter.
//
// One backward per step: a parameter that gets a second gradient before finish_gradient_sync()
// is an error (use no_sync() for accumulation micro-steps). Not supported: create_graph
// (double backward) and parameters on more than one device.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "amplab/dist/communicator.hpp"
#include "amplab/dist/world.hpp"

namespace amplab::dist {

class DistributedDataParallel {
 public:
  // Checks that every rank has the same parameters and buffers (names, dtypes, shapes, which
  // are trainable) and the same bucket size, else an amplab::Error names the first difference
  // and the ranks; then copies rank 0's parameters and buffers to all ranks, builds the buckets
  // and points the .grad of each parameter that shares a bucket at its slice. The model must already be
  // on comm->device().
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<Communicator> comm,
                          const DistConfig& config = {});
  // Removes the gradient hooks (the module may outlive this object). Any gradients still in
  // flight are waited for.
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  torch::nn::Module& module() const { return *module_; }
  Communicator& communicator() const { return *comm_; }

  // Copies rank 0's buffers (BatchNorm running statistics...) to every rank, when
  // broadcast_buffers is on and the model has buffers. Call before each forward.
  void before_forward();

  // Optional, between forward and backward (Trainer::step calls it): with bf16 compression,
  // looks through the graph of `loss` for parameters whose bf16 gradient can be all-reduced
  // before autocast's cast to fp32 (see "Compression" above). Does nothing otherwise. It walks
  // the whole graph once: host time before backward is launched, about 1.5 us per Linear + ReLU
  // layer on our 2-core build machine (6 us for the bench's MLP, 0.7-0.8 ms at 400 layers), hidden
  // while the GPU is still running forward.
  void prepare_for_backward(const torch::Tensor& loss);

  // Sends the buckets not sent during backward, waits for all of them, and leaves every
  // trainable parameter's .grad holding the average over ranks. Call after backward and before
  // GradScaler's unscale, gradient clipping and the optimizer step. Inside no_sync() it does
  // nothing (the gradients stay local until the next synchronized backward).
  // after_each_bucket: called with each bucket's parameters, in launch order, as soon as the
  // current CUDA stream has been made to wait for that bucket (the CPU backend: once it is done),
  // so that work queued in it (the optimizer update of those parameters) runs while later
  // buckets are still being reduced. Every parameter's .grad is final when it is called.
  void finish_gradient_sync(const std::function<void(const std::vector<torch::Tensor>&)>& after_each_bucket = {});
  // Whether every tensor of `params` is a parameter this DDP reduces.
  bool reduces_all_of(const std::vector<torch::Tensor>& params) const;
  // DistConfig::step_each_bucket, for DdpGradientSync.
  bool step_each_bucket() const { return step_each_bucket_; }

  // While alive, backward only accumulates into .grad locally; the next backward outside it
  // all-reduces the accumulated gradients once. For gradient-accumulation micro-steps.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

  // What happened so far, for tests and benchmarks.
  struct Stats {
    int64_t syncs = 0;                     // finish_gradient_sync() calls that synchronized
    int64_t buckets_during_backward = 0;   // all-reduces launched from gradient hooks (overlapped)
    int64_t buckets_at_finish = 0;         // all-reduces launched by finish_gradient_sync()
    int64_t grad_copies = 0;               // fresh .grad tensors copied into their bucket (set_to_none)
    int64_t unused_parameters = 0;         // parameter-steps without a gradient on this rank
    int64_t buckets_handed_over = 0;       // buckets passed to finish_gradient_sync's after_each_bucket
    int64_t reduced_before_cast = 0;       // bf16 compression: gradients all-reduced before autocast's cast to fp32
  };
  Stats stats() const;
  // The parameter names of each bucket, in launch order (the last layer's first).
  std::vector<std::vector<std::string>> bucket_layout() const;
  // The parameters whose .grad is a slice of a bucket's flat buffer (the others are reduced in
  // their own .grad).
  std::vector<std::string> parameters_sharing_a_buffer() const;

 private:
  struct Slot;
  struct Bucket;
  class GradReadyHook;
  class CastGradHook;

  void check_same_model_on_all_ranks(const std::vector<std::string>& signature);
  void build_buckets(double bucket_mb);
  void on_grad_ready(size_t slot);  // called by the hooks, from autograd's thread
  // The bf16 gradient arriving at the backward of autocast's cast (prepare_for_backward's hook):
  // returns what the cast gets, nothing when DDP takes the gradient.
  std::vector<torch::Tensor> on_cast_grad_ready(size_t slot, const std::vector<torch::Tensor>& grads);
  void count_ready(Slot& slot);     // the bookkeeping both hooks share; launches complete buckets
  void launch(size_t bucket, bool during_backward);
  void reset_step();

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<Communicator> comm_;
  bool overlap_;
  bool broadcast_buffers_;
  bool step_each_bucket_;
  Compression compression_;
  std::vector<torch::Tensor> buffers_;

  mutable std::mutex mutex_;  // the hooks run on autograd's thread (the device thread for CUDA)
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  size_t next_bucket_ = 0;  // buckets launch in index order; this one is next
  std::atomic<bool> sync_enabled_{true};
  bool warned_unused_ = false;
  Stats stats_;
};

}  // namespace amplab::dist
