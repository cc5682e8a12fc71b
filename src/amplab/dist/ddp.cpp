#include "amplab/dist/ddp.hpp"

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include <set>
#include <sstream>
#include <unordered_map>

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
  bool before_cast = false;  // bf16 compression: this backward, the gradient is taken before autocast's cast
  bool cast_transposed = false;  // ... which casts the parameter's transpose (CPU autocast's linear)
  torch::Tensor bf16_grad;   // the gradient so taken, sent as it is
  torch::Tensor reduced;     // ... and where its average lands, in the parameter's dtype: .grad at finish
};

// Parameters whose gradients are all-reduced together, in one call: those that share the flat
// buffer, and those reduced in their own .grad (a parameter larger than the cap, or one alone).
struct DistributedDataParallel::Bucket {
  torch::Tensor flat;         // (sum of numel,) of the sharing parameters, their dtype and device; undefined if none
  std::vector<size_t> slots;  // indices into slots_
  size_t pending = 0;         // slots not yet counted in this synchronized backward
  bool launched = false;
  std::shared_ptr<Work> work;
  std::vector<torch::Tensor> compressed;  // bf16 compression: what is in flight, one bf16 tensor per part
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

// Runs before the backward of autocast's cast of a parameter to bf16 (prepare_for_backward), with
// the parameter's whole gradient in bf16.
class DistributedDataParallel::CastGradHook final : public torch::autograd::FunctionPreHook {
 public:
  CastGradHook(DistributedDataParallel* ddp, size_t slot) : ddp_(ddp), slot_(slot) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    return ddp_->on_cast_grad_ready(slot_, grads);
  }
  const DistributedDataParallel* ddp() const { return ddp_; }

 private:
  DistributedDataParallel* ddp_;
  size_t slot_;
};

namespace {

// PyTorch's bf16_compress_hook divides by the world size, then sums. The backend's average (NCCL
// multiplies each input by 1/W before summing; the cpu backend divides first) gives the same bits
// when 1/W is exact in bf16, that is when W is a power of two; otherwise divide first.
std::shared_ptr<Work> average_like_bf16_compress_hook(Communicator& comm, const std::vector<torch::Tensor>& sent) {
  const int W = comm.size();
  if ((W & (W - 1)) == 0) return comm.all_reduce_mean(sent);
  for (auto t : sent) t.div_(W);
  return comm.all_reduce_sum(sent);
}

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
      step_each_bucket_(config.step_each_bucket),
      compression_(config.compression) {
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
    if (p.requires_grad()) {
      Slot slot;
      slot.name = item.key();
      slot.param = p;
      slots_.push_back(std::move(slot));
    }
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
  // Bucket boundaries follow from the parameters and the cap, so the cap must agree too; and every
  // rank must send the same dtype.
  signature.push_back("bucket size " + std::to_string(config.bucket_mb) + " MiB");
  signature.push_back("compression " + enum_to_string(config.compression));
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
  auto bytes_of = [](const torch::Tensor& p) { return static_cast<double>(p.numel()) * p.element_size(); };
  // PyTorch's assignment (compute_bucket_assignment_by_size, without its smaller first bucket): in
  // reverse registration order (backward produces the last layer's gradients first), each
  // parameter joins the open bucket, which closes once it holds at least the cap; so a parameter
  // larger than the cap closes the bucket it joins (a layer's bias and weight travel together). A
  // dtype change starts a new bucket.
  std::vector<std::vector<size_t>> groups;
  double group_bytes = 0;
  bool open = false;
  for (size_t k = slots_.size(); k-- > 0;) {
    const auto& p = slots_[k].param;
    if (!p.is_non_overlapping_and_dense())
      throw Error("DDP: parameter '" + slots_[k].name + "' is not dense in memory (a strided view?); DDP needs dense parameters");
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
    // The parameter that closed the bucket by itself (larger than the cap) is all-reduced in its
    // own .grad: autograd writes the gradient there and nothing is copied, whichever way .grad is
    // zeroed. Two or more others share a flat buffer, one piece in the same all-reduce.
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
  count_ready(slot);
}

std::vector<torch::Tensor> DistributedDataParallel::on_cast_grad_ready(size_t index, const std::vector<torch::Tensor>& grads) {
  std::lock_guard<std::mutex> lock(mutex_);
  Slot& slot = slots_[index];
  if (!slot.before_cast || grads.size() != 1 || !grads[0].defined()) return grads;
  const torch::Tensor grad = slot.cast_transposed ? grads[0].t() : grads[0];
  // Anything unexpected (another layout, a gradient accumulated meanwhile): let the cast run, and
  // the fp32 gradient take the usual way (cast to bf16 when its bucket is sent).
  if (!sync_enabled_ || grad.scalar_type() != torch::kBFloat16 || !grad.is_contiguous() ||
      grad.sizes() != slot.param.sizes() || slot.param.grad().defined()) {
    slot.before_cast = false;
    return grads;
  }
  slot.bf16_grad = grad;
  slot.accumulated = true;
  ++stats_.reduced_before_cast;
  count_ready(slot);
  return {torch::Tensor()};  // nothing for the cast: .grad is written when the all-reduce is done
}

void DistributedDataParallel::count_ready(Slot& slot) {
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
  // One all-reduce for the bucket (a coalesced call on NCCL: one kernel): its flat buffer, then
  // each parameter that is reduced in its own .grad.
  std::vector<torch::Tensor> parts;
  if (bucket.flat.defined()) parts.push_back(bucket.flat);
  // bf16: each part is sent rounded to bf16 (a gradient taken before autocast's cast is bf16
  // already), and its average goes back into the gradients' dtype as soon as it arrives (on NCCL,
  // beside backward); one taken before the cast lands in a new tensor, .grad at finish.
  const bool bf16 = compression_ == Compression::bf16;
  bucket.compressed.clear();
  if (bf16 && bucket.flat.defined()) bucket.compressed.push_back(bucket.flat.to(torch::kBFloat16));
  for (size_t k : bucket.slots) {
    Slot& slot = slots_[k];
    if (slot.view.defined()) continue;
    if (!bf16) {
      parts.push_back(slot.param.grad());
    } else if (slot.bf16_grad.defined()) {
      bucket.compressed.push_back(slot.bf16_grad);
      parts.push_back(slot.reduced = torch::empty_like(slot.param, torch::MemoryFormat::Preserve));
    } else {
      parts.push_back(slot.param.grad());
      bucket.compressed.push_back(parts.back().to(torch::kBFloat16));
    }
  }
  if (!bf16) {
    // The average over ranks: NCCL averages inside the reduction; the cpu backend divides first,
    // as PyTorch does, which also keeps fp16 sums in range.
    bucket.work = comm_->all_reduce_mean(parts);
    return;
  }
  bucket.work = comm_->then_copy(average_like_bf16_compress_hook(*comm_, bucket.compressed), bucket.compressed, parts);
}

void DistributedDataParallel::prepare_for_backward(const torch::Tensor& loss) {
  if (compression_ != Compression::bf16 || comm_->size() == 1 || !sync_enabled_ || !loss.defined() || !loss.grad_fn())
    return;
  using torch::autograd::Node;
  std::lock_guard<std::mutex> lock(mutex_);
  // The accumulator (AccumulateGrad node) of each parameter that could qualify: a bucket of its
  // own, and no gradient accumulated yet (no_sync micro-steps leave one in .grad).
  std::unordered_map<const Node*, size_t> slot_of;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& slot = slots_[i];
    if (slot.view.defined() || slot.param.grad().defined()) continue;
    if (auto accumulator = torch::autograd::impl::try_get_grad_accumulator(slot.param)) slot_of[accumulator.get()] = i;
  }
  if (slot_of.empty()) return;
  // One walk over the graph: how many edges lead into each node, and from which node (the last
  // one seen: it matters only where there is one).
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
  // The one node feeding `node`, or nullptr.
  auto only_feeder = [&](const Node* node) -> Node* {
    auto it = into.find(node);
    return it != into.end() && it->second.first == 1 ? it->second.second : nullptr;
  };
  // Qualifies: the parameter's only gradient comes through autocast's cast to bf16, maybe through
  // transposes (CPU autocast casts W.t(), CUDA autocast W itself).
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
    bucket.compressed.clear();  // bf16 compression: copied back into the gradients by now
    for (size_t k : bucket.slots) {
      Slot& slot = slots_[k];
      // Taken before autocast's cast: the average, cast as that cast would have (reset_step
      // drops the bf16 gradient).
      if (slot.reduced.defined()) slot.param.mutable_grad() = std::move(slot.reduced);
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
  for (auto& slot : slots_) {
    slot.accumulated = slot.counted = slot.before_cast = false;
    slot.bf16_grad = slot.reduced = torch::Tensor();
  }
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

std::vector<std::string> DistributedDataParallel::parameters_sharing_a_buffer() const {
  std::vector<std::string> names;
  for (const auto& slot : slots_)
    if (slot.view.defined()) names.push_back(slot.name);
  return names;
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
