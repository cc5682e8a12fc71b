// Lab 5, data-parallel training: the functions you implement (starter/ddp/ddp_lab.cpp). The lab
// binary (apps/ddp) runs one process per GPU, launched by amplab-run or torchrun --no-python;
// tests/labs/ddp_test.cpp grades your functions, some of them through the launcher.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>

#include "amplab/data/sampler.hpp"
#include "amplab/dist/communicator.hpp"
#include "amplab/dist/ddp.hpp"
#include "amplab/dist/world.hpp"
#include "amplab/error.hpp"  // AMPLAB_TODO in the starter
#include "amplab/run_dir.hpp"

namespace ddp_lab {

// This process's place in the job and its way to talk to the others.
struct Setup {
  amplab::dist::WorldInfo world;
  torch::Device device{torch::kCPU};                  // cuda:LOCAL_RANK on GPUs, else the CPU
  std::shared_ptr<amplab::dist::Communicator> comm;  // NCCL between GPUs, the CPU backend otherwise
};

// TODO(ddp-1): read torchrun's environment, pick this rank's device, connect to the others.
Setup init_distributed(const amplab::dist::DistConfig& config, const std::string& device_spec);

// TODO(ddp-2): wrap the model so that backward averages gradients across ranks.
std::unique_ptr<amplab::dist::DistributedDataParallel> wrap_model(std::shared_ptr<torch::nn::Module> model,
                                                                  const Setup& setup,
                                                                  const amplab::dist::DistConfig& config);

// TODO(ddp-3): this rank's shard of each epoch (disjoint across ranks, reshuffled per epoch from
// a seed all ranks share).
amplab::EpochSampler make_sampler(int64_t dataset_size, int64_t batch_size_per_rank, uint64_t seed,
                                  const amplab::dist::WorldInfo& world);

// TODO(ddp-4): only rank 0 writes the run directory and logs at info level.
amplab::RunDir make_run_dir(const amplab::RunConfig& run, const std::string& resolved_config_yaml,
                            const amplab::dist::WorldInfo& world);

}  // namespace ddp_lab
