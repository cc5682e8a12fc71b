// Plugs data parallelism into the trainer and the loop: the trainer's GradientSync hooks drive
// DistributedDataParallel (no_sync inside accumulation groups, wait before the optimizer step),
// and the loop's metrics and stop decisions are reduced across ranks.
#pragma once

#include <memory>
#include <optional>

#include "amplab/dist/communicator.hpp"
#include "amplab/dist/ddp.hpp"
#include "amplab/loop.hpp"
#include "amplab/trainer.hpp"

namespace amplab::dist {

class DdpGradientSync : public GradientSync {
 public:
  explicit DdpGradientSync(DistributedDataParallel& ddp) : ddp_(ddp) {}
  void before_forward() override { ddp_.before_forward(); }
  void before_backward(const torch::Tensor& loss, bool reduce_after_this) override {
    if (reduce_after_this) local_.reset();
    else if (!local_) local_.emplace(ddp_);
    ddp_.prepare_for_backward(loss);
  }
  void finish() override {
    local_.reset();
    ddp_.finish_gradient_sync();
  }
  bool can_step_each_bucket(const std::vector<torch::Tensor>& params) override {
    return ddp_.step_each_bucket() && ddp_.reduces_all_of(params);
  }
  void finish_stepping_each_bucket(const std::function<void(const std::vector<torch::Tensor>&)>& step_bucket) override {
    local_.reset();
    ddp_.finish_gradient_sync(step_bucket);
  }

 private:
  DistributedDataParallel& ddp_;
  std::optional<DistributedDataParallel::NoSync> local_;
};

// Wires `trainer` to `ddp`'s gradient sync hooks.
void attach(Trainer& trainer, DdpGradientSync& sync);

// Loop hooks: rank 0 writes; losses are averaged across ranks; a stop request (Ctrl-C on any
// rank) is agreed at log points so that every rank stops after the same step.
DistributedHooks loop_hooks(std::shared_ptr<Communicator> comm);

}  // namespace amplab::dist
