// Your copy of this lab's code: fill in every TODO(...) below; the tests tell you which one
// fails. (Instructors: generated from solution/ by scripts/make-starter.py; edit the solution.)
// Lab 5, step 1 (part 1): what every version of data-parallel training starts with. Every rank
// builds the model from its own random seed; before the first step they must agree that it is
// the same model, and all start from rank 0's weights. See labs/ddp/README.md, "Step 1".
#include <torch/csrc/autograd/grad_mode.h>

#include <set>
#include <sstream>

#include "data_parallel.hpp"

namespace ddp_lab {

DataParallel::DataParallel(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<amplab::dist::Communicator> comm,
                           const amplab::dist::DistConfig& config, const std::vector<std::string>& settings)
    : module_(std::move(module)), comm_(std::move(comm)), config_(config) {
  if (!module_ || !comm_) throw amplab::Error("data-parallel training needs a module and a communicator");
  auto on_device = [&](const char* kind, const std::string& name, const torch::Tensor& t) {
    if (t.device() != comm_->device())
      throw amplab::Error(std::string("DDP: ") + kind + " '" + name + "' is on " + t.device().str() + " but rank " +
                          std::to_string(comm_->rank()) + " communicates on " + comm_->device().str() +
                          ": move the model there before wrapping it");
  };
  std::set<const void*> seen;  // a tied weight appears under several names: once is enough
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    on_device("parameter", item.key(), item.value());
    (item.value().requires_grad() ? params_ : frozen_).push_back({item.key(), item.value()});
  }
  for (const auto& item : module_->named_buffers(/*recurse=*/true)) {
    on_device("buffer", item.key(), item.value());
    buffers_.push_back({item.key(), item.value()});
  }
  agree_and_broadcast(settings);
}

// TODO(ddp-4): make sure every rank holds the same model, then copy rank 0's parameters (frozen
// ones too) and buffers to every rank.
// - Agree first: each rank describes its model, one line per tensor (what it is, its name, dtype,
//   shape, and whether it is trained), plus `settings`; the ranks swap descriptions (a collective
//   for small metadata exists in communicator.hpp); on any difference throw amplab::Error naming
//   the first entry that differs, what rank 0 has, and which rank has what instead. Every rank
//   compares the same data, so all of them stop with the same message.
// - Then one collective copies rank 0's tensors into everyone's, in place.
// Pitfalls: a parameter requires grad, and autograd refuses in-place writes into it: write into
// its data (detach() shares the storage) with gradient recording off. Skipping the check is
// tempting: with another model on one rank the collectives pair tensors of other shapes, and the
// error (or the silent garbage) comes much later, far from its cause.
void DataParallel::agree_and_broadcast(const std::vector<std::string>& settings) {
  AMPLAB_TODO("ddp-4");
}

// TODO(ddp-4): before each forward, rank 0's buffers on every rank (when
// config_.broadcast_buffers is on and there is more than one rank).
void DataParallel::before_forward() {
  AMPLAB_TODO("ddp-4");
}

void DataParallel::before_backward(const torch::Tensor& loss, bool reduce_after_this) {
  sync_enabled_ = reduce_after_this;
  prepare_for_backward(loss);
}

void DataParallel::finish_stepping_each_bucket(const std::function<void(const std::vector<torch::Tensor>&)>&) {
  throw amplab::Error("DDP: this version does not step the optimizer bucket by bucket (can_step_each_bucket is false)");
}

}  // namespace ddp_lab
