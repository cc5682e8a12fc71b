// FullyShardedModel's constructor, run_unit, the whole buffers' memory and the collectives
// (sharded_training.hpp): given, no TODOs. Each unit's parameters move into one flat buffer, of
// which this rank keeps its shard; the parameters stay in the model as views of a whole buffer
// whose memory comes and goes.
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <algorithm>
#include <set>

#include "amplab/infra/error.hpp"
#include "amplab/train/grad_ready_hook.hpp"
#include "sharded_training.hpp"

namespace zero_lab {

namespace {

std::string unit_name(size_t u) { return "FullyShardedModel: unit " + std::to_string(u); }

// Gives `storage` `bytes` bytes of fresh memory from its own allocator (the CUDA caching
// allocator on a GPU), or takes its memory away (0). Every tensor that views the storage (the
// unit's parameters, and what autograd saved of them) sees the new memory: the trick FSDP2 plays
// with untyped_storage().resize_().
void set_storage_bytes(c10::StorageImpl& storage, size_t bytes) {
  if (storage.nbytes() == bytes) return;
  storage.set_data_ptr_noswap(bytes == 0 ? c10::DataPtr(nullptr, storage.device()) : storage.allocator()->allocate(bytes));
  storage.set_nbytes(bytes);
}

}  // namespace

FullyShardedModel::FullyShardedModel(std::shared_ptr<LabModel> model, std::shared_ptr<amplab::dist::Communicator> comm,
                                     AdamWOptions options, bool prefetch, ShardedPrecision precision)
    : model_(std::move(model)), comm_(std::move(comm)), options_(options), prefetch_(prefetch), precision_(precision) {
  for (auto dtype : {precision.param_dtype, precision.reduce_dtype})
    if (dtype != torch::kFloat32 && dtype != torch::kBFloat16 && dtype != torch::kFloat16)
      throw amplab::Error(std::string("FullyShardedModel: a precision must be float32, bfloat16 or float16, not ") +
                          c10::toString(dtype));
  torch::NoGradGuard no_grad;
  const auto rank = comm_->rank();
  const auto modules = model_->units();
  const auto used_twice = model_->units_used_twice();
  std::set<const c10::TensorImpl*> seen;
  for (size_t u = 0; u < modules.size(); ++u) {
    Unit unit;
    unit.module = modules[u];
    unit.params = unit.module->parameters();
    if (unit.params.empty()) throw amplab::Error(unit_name(u) + " has no parameters");
    for (const auto& p : unit.params) {
      if (p.device() != comm_->device() || p.scalar_type() != torch::kFloat32)
        throw amplab::Error(unit_name(u) + ": the model must be fp32 on " + comm_->device().str() +
                            " (the communicator's device)");
      if (!seen.insert(p.unsafeGetTensorImpl()).second)
        throw amplab::Error(unit_name(u) + ": a parameter belongs to an earlier unit too");
    }
    unit.layout = flat_layout(unit.params, comm_->size());
    if (unit.layout.offsets.size() != unit.params.size() || unit.layout.padded_numel() < unit.layout.numel)
      throw amplab::Error(unit_name(u) + ": flat_layout gave a layout that does not hold its parameters (TODO sharded_training-1)");
    const auto fp32 = unit.params[0].options().requires_grad(false);
    torch::Tensor flat = torch::zeros({unit.layout.padded_numel()}, fp32);
    for (size_t i = 0; i < unit.params.size(); ++i)
      flat.narrow(0, unit.layout.offsets[i], unit.params[i].numel()).copy_(unit.params[i].reshape(-1));
    unit.shard = flat.narrow(0, unit.layout.shard_begin(rank), unit.layout.shard_numel).clone();
    unit.grad_shard = torch::zeros({unit.layout.shard_numel}, fp32.dtype(precision_.reduce_dtype));
    unit.exp_avg = torch::zeros({unit.layout.shard_numel}, fp32);
    unit.exp_avg_sq = torch::zeros_like(unit.exp_avg);
    // The parameters become views of the whole buffer (in param_dtype), which then lets its
    // memory go: the model's own copy is gone, only the shard is left.
    unit.whole = torch::empty({unit.layout.padded_numel()}, fp32.dtype(precision_.param_dtype));
    for (size_t i = 0; i < unit.params.size(); ++i) {
      auto& p = unit.params[i];
      p.set_data(unit.whole.narrow(0, unit.layout.offsets[i], p.numel()).view(p.sizes()));
      p.mutable_grad().reset();
      amplab::set_grad_ready_hook(p, [this, u] { gradient_accumulated(u); });
    }
    unit.reshard_after_forward = std::find(used_twice.begin(), used_twice.end(), u) == used_twice.end();
    unit.gradients_pending = unit.params.size();
    units_.push_back(std::move(unit));
    reshard(u);
  }
  if (seen.size() != model_->parameters().size())
    throw amplab::Error("FullyShardedModel: " + std::to_string(model_->parameters().size() - seen.size()) +
                        " of the model's parameters belong to no unit");
}

FullyShardedModel::~FullyShardedModel() {
  for (auto& unit : units_)
    for (auto& p : unit.params) amplab::remove_grad_ready_hook(p);
}

torch::Tensor FullyShardedModel::forward(const torch::Tensor& input) {
  const torch::Tensor x = input.is_floating_point() ? input.to(precision_.param_dtype) : input;
  return model_->forward(x, [this](size_t u, const std::function<torch::Tensor()>& part) { return run_unit(u, part); })
      .to(torch::kFloat32);
}

torch::Tensor FullyShardedModel::run_unit(size_t u, const std::function<torch::Tensor()>& part) {
  // Computing with a unit that is not gathered would read memory it does not have.
  auto expect_gathered = [this, u](const char* moment) {
    const Unit& unit = units_.at(u);
    if (!unit.gathered || unit.gathering || unit.whole.storage().nbytes() != unit.whole.nbytes())
      throw amplab::Error(unit_name(u) + " is not gathered after " + moment +
                          " (TODO sharded_training-5: unshard it there, and wait for its all-gather)");
  };
  before_forward(u);
  expect_gathered("before_forward");
  torch::Tensor out = part();
  after_forward(u);
  if (out.requires_grad())
    out.register_hook([this, u, expect_gathered](const torch::Tensor&) {
      before_backward(u);
      expect_gathered("before_backward");
    });
  return out;
}

void FullyShardedModel::gradient_accumulated(size_t u) {
  Unit& unit = units_.at(u);
  if (unit.gradients_pending == 0 || --unit.gradients_pending > 0) return;
  unit.gradients_pending = unit.params.size();  // the next backward's count
  after_backward(u);
}

void FullyShardedModel::start_gather(size_t u) {
  Unit& unit = units_.at(u);
  if (unit.gathering || unit.gathered)
    throw amplab::Error(unit_name(u) + ": start_gather while it is " + (unit.gathered ? "gathered" : "being gathered"));
  set_storage_bytes(*unit.whole.storage().unsafeGetStorageImpl(), unit.whole.nbytes());
  unit.gathering = comm_->all_gather(unit.whole, unit.shard.to(precision_.param_dtype));
}

void FullyShardedModel::reshard(size_t u) {
  Unit& unit = units_.at(u);
  if (unit.gathering) {  // a prefetch still on its way writes into the memory: let it land first
    unit.gathering->wait();
    unit.gathering.reset();
  }
  set_storage_bytes(*unit.whole.storage().unsafeGetStorageImpl(), 0);
  unit.gathered = false;
}

void FullyShardedModel::reduce_scatter_gradient(size_t u, const torch::Tensor& whole_gradient) {
  Unit& unit = units_.at(u);
  if (whole_gradient.numel() != unit.layout.padded_numel())
    throw amplab::Error(unit_name(u) + "'s whole gradient has " + std::to_string(whole_gradient.numel()) +
                        " elements, its flat buffer " + std::to_string(unit.layout.padded_numel()));
  if (unit.reducing) throw amplab::Error(unit_name(u) + " got a second gradient before step()");
  // A collective holds its input until it is waited for. Waiting for the previous unit's
  // reduce-scatter here (the stream waits, not the host) lets its whole gradient go: backward
  // holds two units' gradients at a time instead of every unit's until step(), as FSDP2 does.
  if (last_reducing_) last_reducing_->wait();
  unit.reducing = comm_->reduce_scatter(unit.grad_shard, whole_gradient.to(precision_.reduce_dtype).contiguous(),
                                        amplab::dist::Reduction::mean);
  last_reducing_ = unit.reducing;
}

void FullyShardedModel::zero_grad() {
  last_reducing_.reset();
  for (auto& unit : units_) {
    unit.gradients_pending = unit.params.size();
    for (auto& p : unit.params) p.mutable_grad().reset();
  }
}

torch::Tensor FullyShardedModel::full_parameters() {
  std::vector<torch::Tensor> parts;
  for (auto& unit : units_) {  // the fp32 shards themselves, whatever param_dtype gathers for compute
    torch::Tensor whole = torch::empty({unit.layout.padded_numel()}, unit.exp_avg.options());
    comm_->all_gather(whole, unit.shard)->wait();
    parts.push_back(whole.narrow(0, 0, unit.layout.numel));
  }
  return torch::cat(parts);
}

int64_t FullyShardedModel::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& unit : units_) bytes += unit.exp_avg.nbytes() + unit.exp_avg_sq.nbytes();
  return bytes;
}

}  // namespace zero_lab
