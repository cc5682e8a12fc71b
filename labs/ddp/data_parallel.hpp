// Lab 5: gradient synchronization, written four ways (labs/ddp/README.md has the theory):
//
//   step 1  NaiveDdp       after backward, one all-reduce per gradient             (TODO ddp-4, ddp-5)
//   step 2  FlatDdp        after backward, one all-reduce of one flat buffer       (TODO ddp-6)
//   step 3  OverlappedDdp  each gradient's all-reduce started by its hook, during backward (ddp-7)
//   step 4  BucketedDdp    PyTorch's DDP: buckets started during backward, gradients as views into
//                          them, no_sync for accumulation, unused parameters   (ddp-8, ddp-9, ddp-10)
//           and its fast path, the stretch: bf16 compression                         (ddp-11)
//
// Every version is an amplab::GradientSync (src/amplab/train/trainer.hpp): the trainer calls
// before_forward() and before_backward(loss, reduce_after_this) around each micro-batch, and
// finish() once backward is done and before the optimizer step; after finish() every trainable
// parameter's .grad holds the average of the ranks' gradients, the same bits on every rank. The
// lab binary picks one with dist.sync (make_gradient_sync in ddp_lab.hpp); the graded tests and the
// bench run all four. The solution's BucketedDdp is the course's reference DDP (the one measured in
// the README), so a plain correct version of yours runs everything the reference runs.
//
// Rules every version keeps (the ones collectives impose, as in torch.distributed):
//  - every rank makes the same collective calls, in the same order, with tensors of the same
//    sizes and dtypes; a rank that skips one, or sends another tensor first, leaves the others
//    waiting (or, worse, summing the wrong tensors together);
//  - a parameter that got no gradient on this rank in a step still takes part, with zeros;
//  - while sync is off (no_sync(), or before_backward(..., reduce_after_this=false): the trainer's
//    accumulation micro-batches) gradients only accumulate locally; the next synchronized
//    backward's finish() averages the sum.
#pragma once

#include <torch/csrc/autograd/variable.h>
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
#include "amplab/infra/error.hpp"  // AMPLAB_TODO in the starter
#include "amplab/train/grad_ready_hook.hpp"
#include "amplab/train/trainer.hpp"

namespace ddp_lab {

// ---------------------------------------------------------------- given: gradient hooks

// The core's hook on a parameter's accumulated gradient (amplab/train/grad_ready_hook.hpp):
// set_grad_ready_hook(param, ready) makes autograd call ready() once param.grad() holds this
// backward's value, on autograd's thread, last layers first; one per parameter.
using amplab::has_grad_ready_hook;
using amplab::remove_grad_ready_hook;
using amplab::set_grad_ready_hook;

// ---------------------------------------------------------------- what every version shares

class DataParallel : public amplab::GradientSync {
 public:
  // Given: collects the trainable parameters (registration order; a weight tied under two names
  // once), the frozen ones and the buffers, checks that they are on comm->device(), then calls
  // agree_and_broadcast (TODO ddp-4). `settings` are lines every rank must agree on besides the
  // model (BucketedDdp: the bucket size and the compression). The model must already be on
  // comm->device().
  DataParallel(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<amplab::dist::Communicator> comm,
               const amplab::dist::DistConfig& config, const std::vector<std::string>& settings = {});
  ~DataParallel() override = default;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // TODO(ddp-4): rank 0's buffers (BatchNorm's running statistics...) on every rank, when
  // config.broadcast_buffers is on. Called before each forward.
  void before_forward() override;
  // Given: remembers whether the backward that follows is synchronized (the trainer's
  // accumulation micro-batches are not), then prepare_for_backward(loss).
  void before_backward(const torch::Tensor& loss, bool reduce_after_this) override;
  // Given: only BucketedDdp hands buckets to the optimizer one by one (can_step_each_bucket).
  void finish_stepping_each_bucket(const std::function<void(const std::vector<torch::Tensor>&)>& step_bucket) override;

  // Between forward and backward; BucketedDdp's compression stretch (ddp-11) looks at the graph.
  virtual void prepare_for_backward(const torch::Tensor& /*loss*/) {}

  // While alive, backward only accumulates into .grad locally, and finish() leaves the
  // gradients alone; the next synchronized backward's finish() averages what was accumulated.
  class NoSync {
   public:
    explicit NoSync(DataParallel& ddp) : ddp_(ddp), previous_(ddp.sync_enabled_) { ddp_.sync_enabled_ = false; }
    ~NoSync() { ddp_.sync_enabled_ = previous_; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DataParallel& ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

  torch::nn::Module& module() const { return *module_; }
  amplab::dist::Communicator& communicator() const { return *comm_; }
  // The trainable parameters, as every version synchronizes them.
  struct Param {
    std::string name;
    torch::Tensor tensor;
  };
  const std::vector<Param>& parameters() const { return params_; }

 protected:
  // TODO(ddp-4): every rank must hold the same model, then rank 0's copy of it.
  void agree_and_broadcast(const std::vector<std::string>& settings);
  // Whether the backward running now (or the last one) is to be synchronized.
  bool sync_enabled() const { return sync_enabled_; }

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<amplab::dist::Communicator> comm_;
  amplab::dist::DistConfig config_;
  std::vector<Param> params_;  // trainable: synchronized
  std::vector<Param> frozen_;  // requires_grad = false: copied from rank 0 once, never synchronized
  std::vector<Param> buffers_;
  std::atomic<bool> sync_enabled_{true};
};

// ---------------------------------------------------------------- step 1: naive

class NaiveDdp final : public DataParallel {
 public:
  NaiveDdp(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<amplab::dist::Communicator> comm,
           const amplab::dist::DistConfig& config = {})
      : DataParallel(std::move(module), std::move(comm), config) {}
  // TODO(ddp-5): after backward, one all-reduce per parameter's gradient; the average in .grad.
  void finish() override;
};

// ---------------------------------------------------------------- step 2: flat

class FlatDdp final : public DataParallel {
 public:
  FlatDdp(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<amplab::dist::Communicator> comm,
          const amplab::dist::DistConfig& config = {})
      : DataParallel(std::move(module), std::move(comm), config) {}
  // TODO(ddp-6): after backward, one all-reduce of every gradient at once.
  void finish() override;

 private:
  std::vector<torch::Tensor> flat_;  // yours to use: e.g. buffers kept from one step to the next
};

// ---------------------------------------------------------------- step 3: overlapped

class OverlappedDdp final : public DataParallel {
 public:
  // TODO(ddp-7): a gradient hook on every trainable parameter.
  OverlappedDdp(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<amplab::dist::Communicator> comm,
                const amplab::dist::DistConfig& config = {});
  // Given: release(), whatever it throws (a destructor must not).
  ~OverlappedDdp() override;
  // TODO(ddp-7): send what the hooks did not, wait for everything, average.
  void finish() override;

 private:
  // TODO(ddp-7): params_[index] has its gradient for this backward (called by its hook).
  void on_grad_ready(size_t index);
  // TODO(ddp-7): the module may outlive this object: leave it as it was before (no hooks), with
  // nothing of this object's still in flight.
  void release();

  std::mutex mutex_;         // the hooks run on autograd's thread
  std::vector<size_t> order_;  // indices into params_ in the order every rank sends them
  std::vector<bool> ready_;    // per params_ index: its gradient of this synchronized backward is in .grad
  size_t next_ = 0;            // position in order_ of the next gradient to send
  std::vector<std::shared_ptr<amplab::dist::Work>> in_flight_;  // launched since the last finish(), in order
};

// ---------------------------------------------------------------- step 4: bucketed (the reference)

class BucketedDdp final : public DataParallel {
 public:
  // Given: agree_and_broadcast (through DataParallel), build_buckets(config.bucket_mb) (ddp-8),
  // then hook_parameters() (ddp-9).
  BucketedDdp(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<amplab::dist::Communicator> comm,
              const amplab::dist::DistConfig& config = {});
  // Given: release() (ddp-10), whatever it throws.
  ~BucketedDdp() override;

  // amplab::GradientSync (given, on top of finish_gradient_sync).
  void finish() override { finish_gradient_sync(); }
  bool can_step_each_bucket(const std::vector<torch::Tensor>& params) override;
  void finish_stepping_each_bucket(const std::function<void(const std::vector<torch::Tensor>&)>& step_bucket) override;

  // TODO(ddp-10): sends the buckets backward did not, waits for all of them, and leaves every
  // trainable parameter's .grad holding the average over ranks. Does nothing while sync is off.
  // after_each_bucket (when given): called with each bucket's parameters, in launch order, as soon
  // as that bucket is waited for, so the optimizer can update them while later buckets are still
  // on the wire (Trainer::step with a fused optimizer: dist.step_each_bucket).
  void finish_gradient_sync(const std::function<void(const std::vector<torch::Tensor>&)>& after_each_bucket = {});

  // TODO(ddp-11), the stretch: with bf16 compression, finds the parameters whose bf16 gradient can
  // be sent before autocast's cast to fp32 (README: "bf16 gradients"). Nothing otherwise.
  void prepare_for_backward(const torch::Tensor& loss) override;

  // What happened so far (the bench prints them; the reference's tests check them).
  struct Stats {
    int64_t syncs = 0;                    // finish_gradient_sync() calls that synchronized
    int64_t buckets_during_backward = 0;  // all-reduces launched from gradient hooks (overlapped)
    int64_t buckets_at_finish = 0;        // all-reduces launched by finish_gradient_sync()
    int64_t grad_copies = 0;              // fresh .grad tensors copied into their slice of a bucket
    int64_t unused_parameters = 0;        // parameter-steps without a gradient on this rank
    int64_t buckets_handed_over = 0;      // buckets passed to after_each_bucket
    int64_t reduced_before_cast = 0;      // bf16 compression: gradients sent before autocast's cast
  };
  Stats stats() const;
  // Given: the parameter names of each bucket, in launch order (the last layer's first).
  std::vector<std::vector<std::string>> bucket_layout() const;
  // Given: the parameters whose .grad is a slice of a bucket's flat buffer.
  std::vector<std::string> parameters_sharing_a_buffer() const;
  // Given: whether every tensor of `params` is a parameter this DDP reduces.
  bool reduces_all_of(const std::vector<torch::Tensor>& params) const;

 private:
  // One trainable parameter and its place in a bucket.
  struct Slot {
    std::string name;
    torch::Tensor param;
    size_t bucket = 0;         // index into buckets_
    torch::Tensor view;        // the slice of its bucket's flat buffer that .grad aliases, with the
                               // parameter's shape and strides; undefined for a parameter all-reduced
                               // in its own .grad (a bucket of its own: no copy at all)
    bool accumulated = false;  // got a gradient since the last sync (this backward, or under no_sync)
    bool counted = false;      // counted towards its bucket in this synchronized backward
    // The stretch (ddp-11): this backward its gradient is taken before autocast's cast to fp32.
    bool before_cast = false;
    bool cast_transposed = false;  // ... which casts the parameter's transpose (CPU autocast's linear)
    torch::Tensor bf16_grad;       // the gradient so taken, until its bucket is sent
  };
  // Parameters all-reduced together, in one call.
  struct Bucket {
    std::vector<size_t> slots;  // indices into slots_, in the order they joined
    torch::Tensor flat;         // (sum of their numel,): the buffer the sharing parameters' .grad alias
                                // (undefined when none shares it)
    size_t pending = 0;         // slots not yet counted in this synchronized backward
    std::shared_ptr<amplab::dist::Work> work;  // its all-reduce in flight (launched, not yet waited for)
  };
  class CastGradHook;  // the stretch: a pre-hook on the backward of autocast's cast

  // TODO(ddp-8): a slot per trainable parameter; PyTorch's bucket assignment; flat buffers; .grad
  // as views into them.
  void build_buckets(double bucket_mb);
  // TODO(ddp-9): a gradient hook on every slot's parameter, calling on_grad_ready.
  void hook_parameters();
  // TODO(ddp-9): slots_[index] has its gradient for this backward (called by its hook).
  void on_grad_ready(size_t index);
  // TODO(ddp-9): counts a ready slot towards its bucket; launches complete buckets, in order.
  void count_ready(Slot& slot);
  // TODO(ddp-9): starts buckets_[index]'s all-reduce (the average, asynchronously).
  void launch(size_t index, bool during_backward);
  // TODO(ddp-10): ready for the next step: nothing counted, nothing launched.
  void reset_step();
  // TODO(ddp-10): the module may outlive this object: no hooks of ours left on it, nothing in flight.
  void release();
  // TODO(ddp-11), the stretch: launch() with dist.compression = bf16.
  void launch_compressed(Bucket& bucket);
  // TODO(ddp-11), the stretch: the bf16 gradient arriving at the backward of autocast's cast:
  // returns what the cast gets (nothing when DDP takes the gradient).
  std::vector<torch::Tensor> on_cast_grad_ready(size_t index, const std::vector<torch::Tensor>& grads);

  bool overlap_;           // dist.overlap: launch during backward (false: all at finish)
  bool step_each_bucket_;  // dist.step_each_bucket
  amplab::dist::Compression compression_;

  mutable std::mutex mutex_;  // the hooks run on autograd's thread (the device's own for CUDA)
  std::vector<Slot> slots_;   // one per params_ entry, same order
  std::vector<Bucket> buckets_;  // in launch order
  size_t next_bucket_ = 0;    // buckets launch in index order; this one is next
  bool warned_unused_ = false;
  Stats stats_;
};

}  // namespace ddp_lab
