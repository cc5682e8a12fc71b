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
std::shared_ptr<Communicator> make_nccl_communicator(const WorldInfo&, const DistConfig&) {
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

std::string resolve_backend(const WorldInfo& world, const DistConfig& config, torch::Device run_device) {
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

std::shared_ptr<Communicator> make_communicator(const WorldInfo& world, const DistConfig& config,
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
