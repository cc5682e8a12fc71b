// The loop's hooks for data-parallel training (trainer_sync.hpp): metrics averaged, stops agreed.
#include "amplab/dist/trainer_sync.hpp"

#include <torch/torch.h>

#include "amplab/infra/files.hpp"

namespace amplab::dist {

DistributedHooks loop_hooks(std::shared_ptr<Communicator> comm) {
  DistributedHooks hooks;
  hooks.is_main = comm->rank() == 0;
  hooks.distributed = comm->size() > 1;
  hooks.world_size = comm->size();
  if (!hooks.distributed) return hooks;
  hooks.from_main = [comm](const std::string& mine) { return comm->all_gather_bytes(mine).at(0); };
  hooks.any = [comm](bool local) {
    auto flag = torch::full({1}, local ? 1.0f : 0.0f, torch::dtype(torch::kFloat32).device(comm->device()));
    comm->all_reduce_sum({flag})->wait();
    return flag.item<float>() > 0;
  };
  hooks.mean = [comm](const torch::Tensor& t) { return mean_across_ranks(*comm, t); };
  return hooks;
}

ParameterCheck check_parameters_identical(Communicator& comm, torch::nn::Module& model) {
  std::string bytes;
  for (const auto& p : model.parameters()) {
    auto cpu = p.detach().to(torch::kCPU).contiguous();
    bytes.append(static_cast<const char*>(cpu.data_ptr()), cpu.nbytes());
  }
  ParameterCheck check{true, hex32(crc32_of(bytes))};
  for (const auto& other : comm.all_gather_bytes(check.fingerprint)) check.identical &= other == check.fingerprint;
  return check;
}

}  // namespace amplab::dist
