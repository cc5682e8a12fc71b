// The backend choice, the world-size-1 backend, and the helpers every backend shares.
#include "amplab/dist/communicator.hpp"

#include <torch/csrc/autograd/grad_mode.h>

#include "amplab/dist/backends.hpp"
#include "amplab/infra/error.hpp"

namespace amplab::dist {

namespace detail {

namespace {

class DoneWork final : public Work {
 public:
  void wait() override {}
};

class CopyAfterWork final : public Work {
 public:
  CopyAfterWork(std::shared_ptr<Work> work, std::vector<torch::Tensor> from, std::vector<torch::Tensor> to)
      : work_(std::move(work)), from_(std::move(from)), to_(std::move(to)) {}
  void wait() override {
    work_->wait();
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < to_.size(); ++i) to_[i].copy_(from_[i]);
  }

 private:
  std::shared_ptr<Work> work_;
  std::vector<torch::Tensor> from_, to_;
};

void copy_unless_same(torch::Tensor& to, const torch::Tensor& from) {
  if (to.data_ptr() == from.data_ptr()) return;
  torch::NoGradGuard no_grad;  // the tensors are often parameters
  to.view({-1}).copy_(from.reshape({-1}));
}

// One process: the local tensors already are the sum over all (one) ranks.
class SingleCommunicator final : public Communicator {
 public:
  explicit SingleCommunicator(torch::Device device) : device_(device) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "single"; }
  torch::Device device() const override { return device_; }
  std::shared_ptr<Work> all_reduce_sum(std::vector<torch::Tensor>) override { return std::make_shared<DoneWork>(); }
  void broadcast(std::vector<torch::Tensor>, int root) override {
    if (root != 0) throw Error("broadcast: root " + std::to_string(root) + " is not a rank (world size 1)");
  }
  // With one rank the whole is the part: a copy unless they are the same memory (in place).
  std::shared_ptr<Work> reduce_scatter(torch::Tensor output, torch::Tensor input, Reduction op) override {
    check_whole_and_part(input, output, "reduce_scatter", op);
    copy_unless_same(output, input);
    return std::make_shared<DoneWork>();
  }
  std::shared_ptr<Work> all_gather(torch::Tensor output, torch::Tensor input) override {
    check_whole_and_part(output, input, "all_gather");
    copy_unless_same(output, input);
    return std::make_shared<DoneWork>();
  }
  std::vector<std::string> all_gather_bytes(const std::string& mine) override { return {mine}; }
  void barrier() override {}

 private:
  torch::Device device_;
};

}  // namespace

std::shared_ptr<Communicator> make_single_communicator(torch::Device device) {
  return std::make_shared<SingleCommunicator>(device);
}

#ifndef AMPLAB_WITH_NCCL
std::shared_ptr<Communicator> make_nccl_communicator(const WorldInfo&, const ProcessGroupConfig&) {
  throw Error("this build has no NCCL backend (nccl.h was not found when it was configured); "
              "use --set dist.backend=cpu, or rebuild where NCCL's headers are installed");
}
#endif

}  // namespace detail

std::shared_ptr<Work> Communicator::then_copy(std::shared_ptr<Work> work, std::vector<torch::Tensor> from,
                                              std::vector<torch::Tensor> to) {
  check_copy_pairs(from, to);
  return std::make_shared<detail::CopyAfterWork>(std::move(work), std::move(from), std::move(to));
}

void Communicator::check_copy_pairs(const std::vector<torch::Tensor>& from, const std::vector<torch::Tensor>& to) {
  if (from.size() != to.size())
    throw Error("then_copy: needs one destination per source, got " + std::to_string(from.size()) + " source(s) and " +
                std::to_string(to.size()) + " destination(s)");
}

void Communicator::check_whole_and_part(const torch::Tensor& whole, const torch::Tensor& part, const char* op,
                                        Reduction reduction) const {
  std::string name = std::string(op) + " (rank " + std::to_string(rank()) + ")";
  if (!whole.defined() || !part.defined()) throw Error(name + ": got an undefined tensor");
  if (whole.scalar_type() != part.scalar_type())
    throw Error(name + ": the tensors are " + std::string(c10::toString(whole.scalar_type())) + " and " +
                c10::toString(part.scalar_type()) + "; pass two of one dtype");
  if (!whole.is_contiguous() || !part.is_contiguous())
    throw Error(name + ": the tensors must be contiguous (a chunk of a flat buffer is; call .contiguous())");
  if (whole.numel() != static_cast<int64_t>(size()) * part.numel())
    throw Error(name + ": the whole has " + std::to_string(whole.numel()) + " elements, not world size " +
                std::to_string(size()) + " x the shard's " + std::to_string(part.numel()) +
                "; pad the whole to world size x shard_numel(numel, world size)");
  if (reduction == Reduction::mean && !whole.is_floating_point())
    throw Error(name + ": a mean of " + std::string(c10::toString(whole.scalar_type())) +
                " tensors is not one; use Reduction::sum");
}

int64_t shard_numel(int64_t numel, int world_size) {
  if (numel < 0 || world_size < 1)
    throw Error("shard_numel: " + std::to_string(numel) + " elements over " + std::to_string(world_size) + " ranks");
  return (numel + world_size - 1) / world_size;
}

std::string resolve_backend(const WorldInfo& world, const ProcessGroupConfig& config, torch::Device run_device) {
  if (!world.is_distributed()) return "single";
  switch (config.backend) {
    case Backend::automatic:
      return run_device.is_cuda() ? "nccl" : "cpu";
    case Backend::nccl:
      if (!run_device.is_cuda())
        throw Error("dist.backend=nccl needs a GPU run, but the device is " + run_device.str() +
                    "; use --set dist.backend=cpu (or auto), or run on GPUs");
      return "nccl";
    case Backend::cpu:
      if (run_device.is_cuda())
        throw Error("dist.backend=cpu exchanges CPU tensors, but the device is " + run_device.str() +
                    "; use --set dist.backend=nccl (or auto) for GPU runs");
      return "cpu";
  }
  return "cpu";
}

std::shared_ptr<Communicator> make_communicator(const WorldInfo& world, const ProcessGroupConfig& config,
                                                torch::Device run_device) {
  std::string backend = resolve_backend(world, config, run_device);
  if (backend == "single") return detail::make_single_communicator(run_device);
  if (backend == "nccl") return detail::make_nccl_communicator(world, config);
  return detail::make_cpu_communicator(world, config);
}

torch::Tensor mean_across_ranks(Communicator& comm, const torch::Tensor& value) {
  torch::NoGradGuard no_grad;
  auto dtype = torch::isFloatingType(value.scalar_type()) ? value.scalar_type() : torch::kFloat64;
  torch::Tensor total = value.detach().to(dtype, /*non_blocking=*/false, /*copy=*/true);
  if (comm.size() > 1) comm.all_reduce_sum({total})->wait();
  return total.div_(comm.size());
}

}  // namespace amplab::dist
