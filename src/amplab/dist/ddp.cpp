#include "amplab/dist/ddp.hpp"

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include <set>
#include <sstream>

#include "amplab/error.hpp"
#include "amplab/log.hpp"

namespace amplab::dist {

// One trainable parameter and its slice of a bucket.
struct DistributedDataParallel::Slot {
  std::string name;
  torch::Tensor param;
  torch::Tensor view;  // the slice of the bucket's flat buffer that .grad aliases; param's shape and strides
                       // (undefined when the parameter has a bucket of its own: its .grad is all-reduced in place)
  size_t bucket = 0;
  bool accumulated = false;  // got a gradient since the last sync (in this step or a no_sync micro-step)
  bool counted = false;      // got its gradient in this synchronized backward
};

// Parameters whose gradients are all-reduced together, as one flat buffer; or one parameter
// whose .grad is all-reduced where it is.
struct DistributedDataParallel::Bucket {
  torch::Tensor flat;         // (sum of numel,), the parameters' dtype and device; undefined for one parameter
  std::vector<size_t> slots;  // indices into slots_
  size_t pending = 0;         // slots not yet counted in this synchronized backward
  bool launched = false;
  std::shared_ptr<Work> work;
};

// Runs after autograd has added a parameter's gradient into .grad (torch's
// register_post_accumulate_grad_hook), last layer first.
class DistributedDataParallel::GradReadyHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  GradReadyHook(DistributedDataParallel* ddp, size_t slot) : ddp_(ddp), slot_(slot) {}
  void operator()(const torch::autograd::Variable&) override { ddp_->on_grad_ready(slot_); }

 private:
  DistributedDataParallel* ddp_;
  size_t slot_;
};

namespace {

std::string describe_tensor(const char* kind, const std::string& name, const torch::Tensor& t) {
  std::ostringstream out;
  out << kind << " '" << name << "' " << t.scalar_type() << " " << t.sizes();
  return out.str();
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// `.grad` still is our slice (same memory, same layout), or autograd / the user replaced it.
bool is_slice(const torch::Tensor& grad, const torch::Tensor& view) {
  return grad.defined() && grad.data_ptr() == view.data_ptr() && grad.sizes() == view.sizes() &&
         grad.strides() == view.strides() && grad.scalar_type() == view.scalar_type();
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 std::shared_ptr<Communicator> comm, const DistConfig& config)
    : module_(std::move(module)),
      comm_(std::move(comm)),
      overlap_(config.overlap),
      broadcast_buffers_(config.broadcast_buffers),
      step_each_bucket_(config.step_each_bucket) {
  if (!module_ || !comm_) throw Error("DistributedDataParallel needs a module and a communicator");
  torch::NoGradGuard no_grad;

  // What every rank must agree on, one line per entry; the device is left out (cuda:LOCAL_RANK differs).
  std::vector<std::string> signature;
  std::vector<torch::Tensor> everything;  // parameters then buffers, broadcast from rank 0
  std::set<const void*> seen;             // a tied weight appears under several names: sync it once
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    const auto& p = item.value();
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
    if (p.device() != comm_->device())
      throw Error("DDP: parameter '" + item.key() + "' is on " + p.device().str() + " but rank " +
                  std::to_string(comm_->rank()) + " communicates on " + comm_->device().str() +
                  ": move the model there before wrapping it");
    signature.push_back(describe_tensor(p.requires_grad() ? "parameter" : "frozen parameter", item.key(), p));
    everything.push_back(p.detach());
    if (p.requires_grad()) slots_.push_back(Slot{item.key(), p, {}, 0, false, false});
  }
  for (const auto& item : module_->named_buffers(/*recurse=*/true)) {
    const auto& b = item.value();
    if (b.device() != comm_->device())
      throw Error("DDP: buffer '" + item.key() + "' is on " + b.device().str() + " but rank " +
                  std::to_string(comm_->rank()) + " communicates on " + comm_->device().str() +
                  ": move the model there before wrapping it");
    signature.push_back(describe_tensor("buffer", item.key(), b));
    everything.push_back(b.detach());
    buffers_.push_back(b.detach());
  }
  // Bucket boundaries follow from the parameters and the cap, so the cap must agree too.
  signature.push_back("bucket size " + std::to_string(config.bucket_mb) + " MiB");
  check_same_model_on_all_ranks(signature);

  if (comm_->size() > 1 && !everything.empty()) comm_->broadcast(everything, /*root=*/0);
  build_buckets(config.bucket_mb);

  for (size_t i = 0; i < slots_.size(); ++i) {
    auto& hook = torch::autograd::impl::post_acc_grad_hooks(slots_[i].param);
    if (hook != nullptr)
      throw Error("DDP: parameter '" + slots_[i].name +
                  "' already has a post-accumulate-grad hook: is the model already wrapped by another "
                  "DistributedDataParallel?");
  }
  for (size_t i = 0; i < slots_.size(); ++i)
    torch::autograd::impl::set_post_acc_grad_hooks(slots_[i].param, std::make_unique<GradReadyHook>(this, i));
}

DistributedDataParallel::~DistributedDataParallel() {
  for (auto& slot : slots_) {
    try {
      torch::autograd::impl::set_post_acc_grad_hooks(slot.param, nullptr);
    } catch (...) {
    }
  }
  for (auto& bucket : buckets_) {
    try {
      if (bucket.work) bucket.work->wait();
    } catch (...) {
    }
  }
}

void DistributedDataParallel::check_same_model_on_all_ranks(const std::vector<std::string>& signature) {
  std::string mine;
  for (const auto& line : signature) mine += line + "\n";
  std::vector<std::string> all = comm_->all_gather_bytes(mine);
  // Every rank runs the same comparison on the same data, so all of them report the same thing.
  const std::vector<std::string> reference = split_lines(all[0]);
  for (int r = 1; r < comm_->size(); ++r) {
    if (all[r] == all[0]) continue;
    std::vector<std::string> other = split_lines(all[r]);
    size_t k = 0;
    while (k < reference.size() && k < other.size() && reference[k] == other[k]) ++k;
    std::string rank0 = k < reference.size() ? reference[k] : "nothing more (" + std::to_string(reference.size()) + " entries)";
    std::string rankr = k < other.size() ? other[k] : "nothing more (" + std::to_string(other.size()) + " entries)";
    throw Error("DDP: the model differs across ranks (every rank must build the same model, with the same "
                "dist.bucket_mb): at entry " + std::to_string(k + 1) + ", rank 0 has " + rank0 + " but rank " +
                std::to_string(r) + " has " + rankr);
  }
}

void DistributedDataParallel::build_buckets(double bucket_mb) {
  const double cap_bytes = bucket_mb * 1024.0 * 1024.0;
  // Reverse registration order: backward produces the last layer's gradients first.
  std::vector<std::vector<size_t>> groups;
  double group_bytes = 0;
  for (size_t k = slots_.size(); k-- > 0;) {
    const auto& p = slots_[k].param;
    if (!p.is_non_overlapping_and_dense())
      throw Error("DDP: parameter '" + slots_[k].name + "' is not dense in memory (a strided view?); DDP needs dense parameters");
    double bytes = static_cast<double>(p.numel()) * p.element_size();
    // A parameter larger than the cap gets a bucket of its own; a dtype change starts a new one.
    bool fits = !groups.empty() && group_bytes + bytes <= cap_bytes &&
                slots_[groups.back().front()].param.scalar_type() == p.scalar_type();
    if (!fits) {
      groups.emplace_back();
      group_bytes = 0;
    }
    groups.back().push_back(k);
    group_bytes += bytes;
  }

  for (const auto& group : groups) {
    Bucket bucket;
    bucket.slots = group;
    bucket.pending = group.size();
    for (size_t k : group) slots_[k].bucket = buckets_.size();
    if (group.size() == 1) {
      // A parameter alone in its bucket (a large weight) is all-reduced in its own .grad: autograd
      // writes the gradient there and nothing is copied, whichever way .grad is zeroed.
      buckets_.push_back(std::move(bucket));
      continue;
    }
    int64_t total = 0;
    for (size_t k : group) total += slots_[k].param.numel();
    const auto& first = slots_[group.front()].param;
    bucket.flat = torch::zeros({total}, first.options().requires_grad(false));
    int64_t offset = 0;
    for (size_t k : group) {
      Slot& slot = slots_[k];
      // A plain tensor over the bucket's storage (not an autograd view: LibTorch's zero_grad
      // calls detach_() on .grad, which views refuse), with the parameter's own strides, which
      // autograd's accumulation expects of .grad.
      slot.view = torch::empty({0}, bucket.flat.options())
                      .set_(bucket.flat.storage(), offset, slot.param.sizes(), slot.param.strides());
      if (slot.param.grad().defined()) slot.view.copy_(slot.param.grad());
      slot.param.mutable_grad() = slot.view;
      offset += slot.param.numel();
    }
    buckets_.push_back(std::move(bucket));
  }
}

void DistributedDataParallel::on_grad_ready(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  torch::NoGradGuard no_grad;
  Slot& slot = slots_[index];
  torch::Tensor& grad = slot.param.mutable_grad();
  if (!grad.defined()) return;
  if (slot.view.defined() && !is_slice(grad, slot.view)) {
    // .grad was reset to none (or replaced), so autograd stored a fresh tensor holding the whole
    // gradient: move it into the bucket and alias the slice again.
    slot.view.copy_(grad);
    grad = slot.view;
    ++stats_.grad_copies;
  }
  slot.accumulated = true;
  if (!sync_enabled_) return;  // no_sync(): accumulate locally only

  if (slot.counted) {
    throw Error("DDP: parameter '" + slot.name +
                "' got a second gradient before finish_gradient_sync(): call backward once per step, put "
                "accumulation micro-steps under no_sync(), and call finish_gradient_sync() before the next backward");
  }
  slot.counted = true;
  --buckets_[slot.bucket].pending;
  if (!overlap_) return;
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) launch(next_bucket_++, true);
}

void DistributedDataParallel::launch(size_t index, bool during_backward) {
  Bucket& bucket = buckets_[index];
  bucket.launched = true;
  (during_backward ? stats_.buckets_during_backward : stats_.buckets_at_finish)++;
  if (comm_->size() == 1) return;
  // The average over ranks: NCCL averages inside the reduction; the cpu backend divides first,
  // as PyTorch does, which also keeps fp16 sums in range.
  bucket.work = comm_->all_reduce_mean({bucket.flat.defined() ? bucket.flat : slots_[bucket.slots[0]].param.mutable_grad()});
}

bool DistributedDataParallel::reduces_all_of(const std::vector<torch::Tensor>& params) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& p : params) {
    bool found = false;
    for (const auto& slot : slots_) found = found || slot.param.is_same(p);
    if (!found) return false;
  }
  return true;
}

void DistributedDataParallel::finish_gradient_sync(
    const std::function<void(const std::vector<torch::Tensor>&)>& after_each_bucket) {
  if (!sync_enabled_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  torch::NoGradGuard no_grad;

  // Buckets still here: overlap is off, or a parameter got no gradient in this backward.
  std::string first_unused;
  int64_t unused = 0;
  for (; next_bucket_ < buckets_.size(); ++next_bucket_) {
    for (size_t k : buckets_[next_bucket_].slots) {
      Slot& slot = slots_[k];
      if (slot.counted || slot.accumulated) continue;  // accumulated: from no_sync micro-steps
      // No gradient since the last sync: contribute zeros (the slice may hold last step's values).
      torch::Tensor& grad = slot.param.mutable_grad();
      if (slot.view.defined()) slot.view.zero_();
      else if (grad.defined()) grad.zero_();
      else grad = torch::zeros_like(slot.param.detach());
      if (first_unused.empty()) first_unused = slot.name;
      ++unused;
    }
    launch(next_bucket_, false);
  }
  if (unused > 0) {
    stats_.unused_parameters += unused;
    if (!warned_unused_) {
      warned_unused_ = true;
      log::warn("DDP: parameter '" + first_unused + "'" +
                (unused > 1 ? " and " + std::to_string(unused - 1) + " more" : std::string()) + " got no gradient on rank " +
                std::to_string(comm_->rank()) +
                " in this step; it contributes zeros to the average (see dist/ddp.hpp; freeze parameters you do not "
                "train). Warned once.");
    }
  }

  for (auto& bucket : buckets_) {
    if (bucket.work) bucket.work->wait();
    bucket.work.reset();
    for (size_t k : bucket.slots) {
      Slot& slot = slots_[k];
      // A parameter without a gradient this step still has .grad = none: give it its slice, so
      // every rank steps every parameter.
      if (slot.view.defined() && !is_slice(slot.param.grad(), slot.view)) slot.param.mutable_grad() = slot.view;
    }
    if (after_each_bucket) {
      std::vector<torch::Tensor> params;
      for (size_t k : bucket.slots) params.push_back(slots_[k].param);
      after_each_bucket(params);
      ++stats_.buckets_handed_over;
    }
  }
  ++stats_.syncs;
  reset_step();
}

void DistributedDataParallel::reset_step() {
  for (auto& slot : slots_) slot.accumulated = slot.counted = false;
  for (auto& bucket : buckets_) {
    bucket.pending = bucket.slots.size();
    bucket.launched = false;
  }
  next_bucket_ = 0;
}

void DistributedDataParallel::before_forward() {
  if (!broadcast_buffers_ || comm_->size() == 1 || buffers_.empty()) return;
  comm_->broadcast(buffers_, /*root=*/0);
}

DistributedDataParallel::NoSync::NoSync(DistributedDataParallel& ddp) : ddp_(ddp), previous_(ddp.sync_enabled_) {
  ddp_.sync_enabled_ = false;
}

DistributedDataParallel::NoSync::~NoSync() { ddp_.sync_enabled_ = previous_; }

DistributedDataParallel::Stats DistributedDataParallel::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

std::vector<std::vector<std::string>> DistributedDataParallel::bucket_layout() const {
  std::vector<std::vector<std::string>> layout;
  for (const auto& bucket : buckets_) {
    layout.emplace_back();
    for (size_t k : bucket.slots) layout.back().push_back(slots_[k].name);
  }
  return layout;
}

}  // namespace amplab::dist
