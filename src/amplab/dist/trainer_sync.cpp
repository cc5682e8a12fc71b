// The loop's hooks for data-parallel training (trainer_sync.hpp): metrics averaged, stops agreed.
#include "amplab/dist/trainer_sync.hpp"

#include <torch/torch.h>

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

}  // namespace amplab::dist
