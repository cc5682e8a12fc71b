// Internal to the dist code: the factories behind make_communicator(), one per backend.
#pragma once

#include <torch/types.h>

#include <memory>

#include "amplab/dist/communicator.hpp"

namespace amplab::dist::detail {

// World size 1: collectives return at once (the data already is "the sum over all ranks").
std::shared_ptr<Communicator> make_single_communicator(torch::Device device);
// Store-based collectives on CPU tensors (cpu_communicator.cpp).
std::shared_ptr<Communicator> make_cpu_communicator(const WorldInfo& world, const ProcessGroupConfig& config);
// ProcessGroupNCCL on cuda:LOCAL_RANK (nccl_communicator.cpp; only in builds with nccl.h).
std::shared_ptr<Communicator> make_nccl_communicator(const WorldInfo& world, const ProcessGroupConfig& config);

}  // namespace amplab::dist::detail
