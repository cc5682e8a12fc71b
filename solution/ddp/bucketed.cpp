// Lab 5, step 4: PyTorch's DistributedDataParallel, in C++. Step 3 overlaps, but pays a
// collective's latency per parameter; step 2 pays it once, but only after backward. Buckets are
// the middle: parameters grouped into buckets of about dist.bucket_mb, each bucket one all-reduce,
// started during backward as soon as its last gradient is in. Gradients live in the buckets'
// flat buffers, each .grad a view of its slice (PyTorch's gradient_as_bucket_view=True), so the
// all-reduce works on them in place, with no copy into a bucket and back out around it. With
// zero_grad(false) autograd accumulates straight into the slice; with zero_grad() (set_to_none,
// what the trainer does) autograd stores a fresh tensor and the hook copies it into the slice and
// points .grad back at it (stats().grad_copies). See labs/ddp/README.md, "Step 4". The solution of
// this file is the course's reference DDP.
//
// Parameters without a gradient in a step (a branch not taken on this rank) contribute zeros;
// after finish every trainable parameter has a defined .grad, equal on all ranks, so all ranks
// step identically. (Unlike one process, where such a .grad stays undefined and the optimizer
// skips it: with weight decay or momentum the update differs. Freeze what you never train.) The
// first time it happens a warning names the parameter. A rank that leaves a parameter unused also
// loses the overlap for its bucket and those after it (they go at finish).
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include <set>
#include <unordered_map>

#include "amplab/infra/log.hpp"
#include "data_parallel.hpp"

namespace ddp_lab {

namespace {

// Whether `grad` still is the slice `view` (same memory and layout), or autograd (set_to_none) or
// the user replaced .grad by another tensor.
[[maybe_unused]] bool grad_is_view_of(const torch::Tensor& grad, const torch::Tensor& view) {
  return grad.defined() && grad.data_ptr() == view.data_ptr() && grad.sizes() == view.sizes() &&
         grad.strides() == view.strides() && grad.scalar_type() == view.scalar_type();
}

// The stretch (ddp-11): a compressed bucket in flight. wait() waits for the all-reduce and the
// copies of the bf16 averages into the gradients' dtype (Communicator::then_copy), then makes
// each average taken before autocast's cast the parameter's .grad. It keeps the bf16 tensors
// alive until then.
class CompressedWork final : public amplab::dist::Work {
 public:
  CompressedWork(std::shared_ptr<amplab::dist::Work> work, std::vector<torch::Tensor> in_flight,
                 std::vector<std::pair<torch::Tensor, torch::Tensor>> new_grads)
      : work_(std::move(work)), in_flight_(std::move(in_flight)), new_grads_(std::move(new_grads)) {}
  void wait() override {
    work_->wait();
    for (auto& [param, grad] : new_grads_) param.mutable_grad() = std::move(grad);
    new_grads_.clear();
    in_flight_.clear();
  }

 private:
  std::shared_ptr<amplab::dist::Work> work_;
  std::vector<torch::Tensor> in_flight_;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> new_grads_;  // (parameter, its averaged gradient)
};

}  // namespace

// The stretch (ddp-11): runs before the backward of autocast's cast of a parameter to bf16
// (prepare_for_backward adds it), with the parameter's whole gradient in bf16.
class BucketedDdp::CastGradHook final : public torch::autograd::FunctionPreHook {
 public:
  CastGradHook(BucketedDdp* ddp, size_t slot) : ddp_(ddp), slot_(slot) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    return ddp_->on_cast_grad_ready(slot_, grads);
  }
  const BucketedDdp* ddp() const { return ddp_; }

 private:
  BucketedDdp* ddp_;
  size_t slot_;
};

BucketedDdp::BucketedDdp(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<amplab::dist::Communicator> comm,
                         const amplab::dist::DistConfig& config)
    // Bucket boundaries follow from the parameters and the cap, so the cap must agree too; and
    // every rank must send the same dtype.
    : DataParallel(std::move(module), std::move(comm), config,
                   {"bucket size " + std::to_string(config.bucket_mb) + " MiB",
                    "compression " + amplab::enum_to_string(config.compression)}),
      overlap_(config.overlap),
      step_each_bucket_(config.step_each_bucket),
      compression_(config.compression) {
  torch::NoGradGuard no_grad;
  build_buckets(config.bucket_mb);
  hook_parameters();
}

BucketedDdp::~BucketedDdp() {
  try {
    release();
  } catch (...) {
  }
}

// TODO(ddp-8): the buckets (PyTorch's assignment, simplified), and the gradients' home in them.
// - Slots: one per trainable parameter (params_), in the same order.
// - Assignment: walk the parameters in reverse registration order (the order backward usually
//   produces their gradients: last layer first); each joins the open bucket, which closes once it
//   holds cap_bytes = bucket_mb MiB or more (so a parameter larger than the cap closes the bucket
//   it joins, and a layer's bias travels with its weight). A parameter of another dtype than the
//   open bucket's starts a new one (one buffer, one dtype). Record each slot's bucket. Built once,
//   here. (PyTorch differs: one open bucket per dtype and device; with its defaults, one bucket in
//   the first iteration, then buckets rebuilt once in the order the gradients arrived, the first
//   capped at 1 MiB. labs/ddp/README.md, "Step 4", has the details.)
// - Buffers: give the bucket a flat buffer (zeros; the parameters' dtype and device, no autograd)
//   and point each parameter's .grad at its slice (Slot::view): shaped and strided like the
//   parameter, because autograd accumulates into .grad assuming the parameter's layout. A
//   gradient already in .grad moves into its slice. A parameter that has a bucket to itself needs
//   no buffer: its .grad can be all-reduced where it is (leave Slot::view undefined).
// - Set each bucket's pending count for the first backward.
// Pitfalls: the slice must be a plain tensor over the buffer's storage, not an autograd view
// (LibTorch's zero_grad detaches .grad in place, which views refuse): make an empty tensor and
// set its storage, offset, sizes and strides. Parameters must be dense (no gaps in memory), or
// their layout has no slice: refuse others with an error naming them.
void BucketedDdp::build_buckets(double bucket_mb) {
  // BEGIN SOLUTION
  for (const Param& p : params_) {
    Slot slot;
    slot.name = p.name;
    slot.param = p.tensor;
    slots_.push_back(std::move(slot));
  }
  const double cap_bytes = bucket_mb * 1024.0 * 1024.0;
  auto bytes_of = [](const torch::Tensor& p) { return static_cast<double>(p.numel()) * p.element_size(); };
  std::vector<std::vector<size_t>> groups;
  double group_bytes = 0;
  bool open = false;
  for (size_t k = slots_.size(); k-- > 0;) {
    const auto& p = slots_[k].param;
    if (!p.is_non_overlapping_and_dense())
      throw amplab::Error("DDP: parameter '" + slots_[k].name +
                          "' is not dense in memory (a strided view?); DDP needs dense parameters");
    if (!open || slots_[groups.back().front()].param.scalar_type() != p.scalar_type()) {
      groups.emplace_back();
      group_bytes = 0;
      open = true;
    }
    groups.back().push_back(k);
    group_bytes += bytes_of(p);
    if (group_bytes >= cap_bytes) open = false;
  }

  for (const auto& group : groups) {
    Bucket bucket;
    bucket.slots = group;
    bucket.pending = group.size();
    for (size_t k : group) slots_[k].bucket = buckets_.size();
    // The reference's layout, a step beyond the README's: the parameter that closed the bucket by
    // itself (larger than the cap: a big weight) keeps its own .grad, all-reduced in place
    // (autograd writes it there, and even set_to_none needs no copy), and so does any parameter
    // with no other small one beside it; two or more smaller ones share the flat buffer.
    std::vector<size_t> small = group;
    if (group.size() == 1 || bytes_of(slots_[group.back()].param) >= cap_bytes) small.pop_back();
    if (small.size() < 2) {
      buckets_.push_back(std::move(bucket));  // every parameter in its own .grad
      continue;
    }
    int64_t total = 0;
    for (size_t k : small) total += slots_[k].param.numel();
    bucket.flat = torch::zeros({total}, slots_[small.front()].param.options().requires_grad(false));
    int64_t offset = 0;
    for (size_t k : small) {
      Slot& slot = slots_[k];
      slot.view = torch::empty({0}, bucket.flat.options())
                      .set_(bucket.flat.storage(), offset, slot.param.sizes(), slot.param.strides());
      if (slot.param.grad().defined()) slot.view.copy_(slot.param.grad());
      slot.param.mutable_grad() = slot.view;
      offset += slot.param.numel();
    }
    buckets_.push_back(std::move(bucket));
  }
  // END SOLUTION
}

// TODO(ddp-9): every slot's parameter gets a gradient hook that calls on_grad_ready with the
// slot's index. A parameter that already has one belongs to another DDP (a model wrapped twice):
// refuse it with an amplab::Error naming it, before hooking anything.
void BucketedDdp::hook_parameters() {
  // BEGIN SOLUTION
  for (const Slot& slot : slots_)
    if (has_grad_ready_hook(slot.param))
      throw amplab::Error("DDP: parameter '" + slot.name +
                          "' already has a post-accumulate-grad hook: is the model already wrapped by another DDP?");
  for (size_t k = 0; k < slots_.size(); ++k) set_grad_ready_hook(slots_[k].param, [this, k] { on_grad_ready(k); });
  // END SOLUTION
}

// TODO(ddp-9): the hook of slots_[index]: its gradient of this backward is in .grad.
// If .grad is no longer the slot's view (zero_grad set it to none, and autograd stored a fresh
// tensor), move the gradient into the view and point .grad back at it (count it in
// stats_.grad_copies). Remember that the slot got a gradient since the last sync (for finish),
// then, unless sync is off, count it towards its bucket.
void BucketedDdp::on_grad_ready(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  torch::NoGradGuard no_grad;
  // BEGIN SOLUTION
  Slot& slot = slots_[index];
  torch::Tensor& grad = slot.param.mutable_grad();
  if (!grad.defined()) return;
  if (slot.view.defined() && !grad_is_view_of(grad, slot.view)) {
    slot.view.copy_(grad);
    grad = slot.view;
    ++stats_.grad_copies;
  }
  slot.accumulated = true;
  if (!sync_enabled()) return;
  count_ready(slot);
  // END SOLUTION
}

// TODO(ddp-9): one more gradient of this synchronized backward is in. A slot counted twice
// before finish (two backwards without no_sync) is an error naming the parameter. When overlap is
// on (overlap_), launch every bucket that is complete, in bucket order only: bucket k+1 waits for
// bucket k even if it completed first, so that every rank launches the same buckets in the same
// order (a branch taken on one rank only changes the order in which gradients arrive).
void BucketedDdp::count_ready(Slot& slot) {
  // BEGIN SOLUTION
  if (slot.counted) {
    throw amplab::Error("DDP: parameter '" + slot.name +
                        "' got a second gradient before finish_gradient_sync(): call backward once per step, put "
                        "accumulation micro-steps under no_sync(), and call finish_gradient_sync() before the next "
                        "backward");
  }
  slot.counted = true;
  --buckets_[slot.bucket].pending;
  if (!overlap_) return;
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) launch(next_bucket_++, true);
  // END SOLUTION
}

// TODO(ddp-9): the bucket's all-reduce, asynchronously, averaging over the ranks: one call for
// the bucket, carrying its flat buffer and the .grad of each parameter reduced in place. Keep
// the work in the bucket (finish waits for it).
void BucketedDdp::launch(size_t index, bool during_backward) {
  Bucket& bucket = buckets_[index];
  (during_backward ? stats_.buckets_during_backward : stats_.buckets_at_finish)++;
  if (comm_->size() == 1) return;  // alone, the gradients already are the average
  if (compression_ == amplab::dist::Compression::bf16) {
    launch_compressed(bucket);  // the stretch
    return;
  }
  // BEGIN SOLUTION
  std::vector<torch::Tensor> parts;
  if (bucket.flat.defined()) parts.push_back(bucket.flat);
  for (size_t k : bucket.slots)
    if (!slots_[k].view.defined()) parts.push_back(slots_[k].param.grad());
  // NCCL averages inside the reduction; the cpu backend divides first, as PyTorch does, which
  // also keeps fp16 sums in range.
  bucket.work = comm_->all_reduce_mean(parts);
  // END SOLUTION
}

// TODO(ddp-10): after backward, and before the optimizer step (nothing while sync is off):
// 1. launch, in order, the buckets still waiting (overlap off, or a parameter got no gradient in
//    this backward). A slot with no gradient since the last sync (not counted, not accumulated
//    under no_sync) contributes zeros: its slice may still hold last step's average. Warn once
//    (amplab::log::warn), naming the first such parameter and the rank, and count them in
//    stats_.unused_parameters;
// 2. wait for each bucket in launch order; then every parameter's .grad must be its slice again
//    (a parameter without a gradient this step still has .grad = none), and after_each_bucket,
//    when given, gets that bucket's parameters (count stats_.buckets_handed_over);
// 3. count the sync (stats_.syncs) and reset for the next step (reset_step).
void BucketedDdp::finish_gradient_sync(const std::function<void(const std::vector<torch::Tensor>&)>& after_each_bucket) {
  if (!sync_enabled()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  torch::NoGradGuard no_grad;
  // BEGIN SOLUTION
  std::string first_unused;
  int64_t unused = 0;
  for (; next_bucket_ < buckets_.size(); ++next_bucket_) {
    for (size_t k : buckets_[next_bucket_].slots) {
      Slot& slot = slots_[k];
      if (slot.counted || slot.accumulated) continue;
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
      amplab::log::warn("DDP: parameter '" + first_unused + "'" +
                        (unused > 1 ? " and " + std::to_string(unused - 1) + " more" : std::string()) +
                        " got no gradient on rank " + std::to_string(comm_->rank()) +
                        " in this step; it contributes zeros to the average (see labs/ddp/README.md; freeze "
                        "parameters you do not train). Warned once.");
    }
  }
  for (auto& bucket : buckets_) {
    if (bucket.work) bucket.work->wait();
    bucket.work.reset();
    for (size_t k : bucket.slots) {
      Slot& slot = slots_[k];
      if (slot.view.defined() && !grad_is_view_of(slot.param.grad(), slot.view)) slot.param.mutable_grad() = slot.view;
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
  // END SOLUTION
}

// TODO(ddp-10): nothing counted, accumulated or launched: every bucket pending in full again.
void BucketedDdp::reset_step() {
  // BEGIN SOLUTION
  for (auto& slot : slots_) slot.accumulated = slot.counted = false;
  for (auto& bucket : buckets_) bucket.pending = bucket.slots.size();
  next_bucket_ = 0;
  // END SOLUTION
}

// TODO(ddp-10): undo hook_parameters (the module may be trained alone or wrapped again once this
// object is gone; a hook left behind would call into freed memory) and wait for every bucket
// still in flight (it writes into the gradients). Try to do all of it even when one part fails.
void BucketedDdp::release() {
  // BEGIN SOLUTION
  for (auto& slot : slots_) {
    try {
      remove_grad_ready_hook(slot.param);
    } catch (...) {
    }
  }
  for (auto& bucket : buckets_) {
    try {
      if (bucket.work) bucket.work->wait();
    } catch (...) {
    }
    bucket.work.reset();
  }
  // END SOLUTION
}

// TODO(ddp-11): the stretch (points of its own): dist.compression = bf16. Gradients travel as
// bfloat16, half the bytes, and .grad ends up holding exactly what PyTorch's bf16_compress_hook
// gives: each rank's gradient rounded to bf16 and divided by the world size, summed across ranks
// in bf16, then written back in the parameter's dtype.
// - Every part of the bucket goes out as a bf16 copy, except a gradient taken before autocast's
//   cast (Slot::bf16_grad, see prepare_for_backward), which is bf16 already and goes as it is;
//   its average lands in a new tensor that becomes .grad once the bucket is waited for. The
//   averages are copied back into the gradients with Communicator::then_copy (on NCCL: on a side
//   stream, beside backward); CompressedWork above puts it all together for finish's wait().
// - Bit-exact with the hook: the backend's average (NCCL multiplies each input by 1/W inside the
//   sum; the cpu backend divides first) rounds like "divide, then sum" only when 1/W is exact in
//   bf16, i.e. when W is a power of two; otherwise divide the bf16 tensors first and sum.
void BucketedDdp::launch_compressed(Bucket& bucket) {
  // BEGIN SOLUTION
  std::vector<torch::Tensor> parts, sent;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> new_grads;
  if (bucket.flat.defined()) {
    parts.push_back(bucket.flat);
    sent.push_back(bucket.flat.to(torch::kBFloat16));
  }
  for (size_t k : bucket.slots) {
    Slot& slot = slots_[k];
    if (slot.view.defined()) continue;
    if (slot.bf16_grad.defined()) {
      sent.push_back(std::move(slot.bf16_grad));
      slot.bf16_grad = torch::Tensor();
      parts.push_back(torch::empty_like(slot.param, torch::MemoryFormat::Preserve));
      new_grads.emplace_back(slot.param, parts.back());
    } else {
      parts.push_back(slot.param.grad());
      sent.push_back(parts.back().to(torch::kBFloat16));
    }
  }
  const int W = comm_->size();
  std::shared_ptr<amplab::dist::Work> reduced;
  if ((W & (W - 1)) == 0) {
    reduced = comm_->all_reduce_mean(sent);
  } else {
    for (auto& t : sent) t.div_(W);
    reduced = comm_->all_reduce_sum(sent);
  }
  bucket.work = std::make_shared<CompressedWork>(comm_->then_copy(reduced, sent, parts), sent, std::move(new_grads));
  // END SOLUTION
}

// TODO(ddp-11): the stretch. Under bf16 autocast a weight's gradient is computed in bf16 and only
// then cast to fp32 (the backward of autocast's cast): rounding it back to bf16 to send it would
// change nothing. Find the parameters whose only gradient comes through such a cast (maybe through
// transposes: CPU autocast casts W.t(), CUDA autocast W itself), among those reduced in their own
// .grad with nothing accumulated yet, and put a CastGradHook on the cast's backward node (once);
// mark the slot before_cast (and cast_transposed). One walk over the graph from loss.grad_fn():
// count the edges into each node and remember one node they come from.
void BucketedDdp::prepare_for_backward(const torch::Tensor& loss) {
  if (compression_ != amplab::dist::Compression::bf16 || comm_->size() == 1 || !sync_enabled()) return;
  if (!loss.defined() || !loss.grad_fn()) return;
  // BEGIN SOLUTION
  using torch::autograd::Node;
  std::lock_guard<std::mutex> lock(mutex_);
  // The accumulator (AccumulateGrad node) of each parameter that could qualify.
  std::unordered_map<const Node*, size_t> slot_of;
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& slot = slots_[i];
    slot.before_cast = false;
    if (slot.view.defined() || slot.param.grad().defined()) continue;
    if (auto accumulator = torch::autograd::impl::try_get_grad_accumulator(slot.param)) slot_of[accumulator.get()] = i;
  }
  if (slot_of.empty()) return;
  std::unordered_map<const Node*, std::pair<int, Node*>> into;  // node -> (edges in, a node they come from)
  std::vector<Node*> stack{loss.grad_fn().get()};
  into[stack.front()] = {0, nullptr};
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const auto& edge : node->next_edges()) {
      Node* next = edge.function.get();
      if (next == nullptr) continue;
      auto [it, first_time] = into.try_emplace(next, 0, nullptr);
      it->second.first += 1;
      it->second.second = node;
      if (first_time && !slot_of.count(next)) stack.push_back(next);
    }
  }
  auto only_feeder = [&](const Node* node) -> Node* {
    auto it = into.find(node);
    return it != into.end() && it->second.first == 1 ? it->second.second : nullptr;
  };
  for (const auto& [accumulator, i] : slot_of) {
    bool transposed = false;
    Node* cast = only_feeder(accumulator);
    while (cast != nullptr && cast->name() == "TBackward0") {
      transposed = !transposed;
      cast = only_feeder(cast);
    }
    if (cast == nullptr || cast->name() != "ToCopyBackward0" || cast->num_inputs() != 1 ||
        c10::typeMetaToScalarType(cast->input_metadata(0).dtype()) != torch::kBFloat16)
      continue;
    bool hooked = false;  // the same cast node twice (a graph kept for a second backward)
    for (const auto& hook : cast->pre_hooks())
      if (auto* mine = dynamic_cast<const CastGradHook*>(hook.get())) hooked = hooked || mine->ddp() == this;
    if (!hooked) cast->add_pre_hook(std::make_unique<CastGradHook>(this, i));
    slots_[i].before_cast = true;
    slots_[i].cast_transposed = transposed;
  }
  // END SOLUTION
}

// TODO(ddp-11): the stretch. The cast's backward is about to run with the parameter's bf16
// gradient. Take it when the slot is marked and it is what is expected (sync on, one bf16
// contiguous gradient of the parameter's shape, untransposed as cast_transposed says, nothing in
// .grad yet): keep it in Slot::bf16_grad, mark the slot accumulated, count it ready
// (stats_.reduced_before_cast) and give the cast nothing (one undefined tensor). Anything else:
// unmark the slot and give the cast its gradients unchanged (the fp32 way still works).
std::vector<torch::Tensor> BucketedDdp::on_cast_grad_ready(size_t index, const std::vector<torch::Tensor>& grads) {
  std::lock_guard<std::mutex> lock(mutex_);
  // BEGIN SOLUTION
  Slot& slot = slots_[index];
  if (!slot.before_cast || grads.size() != 1 || !grads[0].defined()) return grads;
  const torch::Tensor grad = slot.cast_transposed ? grads[0].t() : grads[0];
  if (!sync_enabled() || grad.scalar_type() != torch::kBFloat16 || !grad.is_contiguous() ||
      grad.sizes() != slot.param.sizes() || slot.param.grad().defined()) {
    slot.before_cast = false;
    return grads;
  }
  slot.before_cast = false;
  slot.bf16_grad = grad;
  slot.accumulated = true;
  ++stats_.reduced_before_cast;
  count_ready(slot);
  return {torch::Tensor()};
  // END SOLUTION
}

bool BucketedDdp::can_step_each_bucket(const std::vector<torch::Tensor>& params) {
  return step_each_bucket_ && reduces_all_of(params);
}

void BucketedDdp::finish_stepping_each_bucket(
    const std::function<void(const std::vector<torch::Tensor>&)>& step_bucket) {
  // The trainer steps only what is handed over: every parameter must be, once.
  std::set<const c10::TensorImpl*> stepped;
  size_t handed = 0;
  finish_gradient_sync([&](const std::vector<torch::Tensor>& params) {
    for (const auto& p : params) stepped.insert(p.unsafeGetTensorImpl());
    handed += params.size();
    step_bucket(params);
  });
  if (stepped.size() != slots_.size() || handed != slots_.size())
    throw amplab::Error("DDP: finish_gradient_sync handed " + std::to_string(handed) + " parameter(s) (" +
                        std::to_string(stepped.size()) + " different) of " + std::to_string(slots_.size()) +
                        " to after_each_bucket: each bucket's parameters, once, after its wait (the optimizer "
                        "updates only what it gets)");
}

BucketedDdp::Stats BucketedDdp::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

bool BucketedDdp::reduces_all_of(const std::vector<torch::Tensor>& params) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& p : params) {
    bool found = false;
    for (const auto& slot : slots_) found = found || slot.param.is_same(p);
    if (!found) return false;
  }
  return true;
}

std::vector<std::string> BucketedDdp::parameters_sharing_a_buffer() const {
  std::vector<std::string> names;
  for (const auto& slot : slots_)
    if (slot.view.defined()) names.push_back(slot.name);
  return names;
}

std::vector<std::vector<std::string>> BucketedDdp::bucket_layout() const {
  std::vector<std::vector<std::string>> layout;
  for (const auto& bucket : buckets_) {
    layout.emplace_back();
    for (size_t k : bucket.slots) layout.back().push_back(slots_[k].name);
  }
  return layout;
}

}  // namespace ddp_lab
