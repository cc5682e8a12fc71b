// Lab 5, data-parallel training. Each TODO below is one exercise; see labs/ddp/README.md.
#include "ddp_lab.hpp"

#include "amplab/device.hpp"
#include "amplab/log.hpp"

namespace ddp_lab {

Setup init_distributed(const amplab::dist::DistConfig& config, const std::string& device_spec) {
  Setup setup;
  // TODO(ddp-1): Read the job from the environment with amplab::dist::world_from_env() (it
  // explains a missing or bad variable). Device: the CPU when device_spec is "cpu", or "auto" on
  // a machine without a GPU; otherwise GPU number world.local_rank (one process per GPU on each
  // node), and "cuda" where there is no GPU is an error (amplab::resolve_device explains it). Then
  // amplab::dist::make_communicator(world, config, device) connects to the other ranks.
  // BEGIN SOLUTION
  setup.world = amplab::dist::world_from_env();
  bool gpu = device_spec != "cpu" && (device_spec != "auto" || amplab::cuda_available());
  if (gpu) amplab::resolve_device("cuda");  // throws when there is no GPU
  setup.device = gpu ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(setup.world.local_rank))
                     : torch::Device(torch::kCPU);
  setup.comm = amplab::dist::make_communicator(setup.world, config, setup.device);
  // END SOLUTION
  return setup;
}

std::unique_ptr<amplab::dist::DistributedDataParallel> wrap_model(std::shared_ptr<torch::nn::Module> model,
                                                                  const Setup& setup,
                                                                  const amplab::dist::DistConfig& config) {
  // TODO(ddp-2): Move the model to setup.device, then wrap it in
  // amplab::dist::DistributedDataParallel with setup.comm and config: that checks all ranks
  // hold the same model, copies rank 0's weights to everyone and hooks the gradients.
  // BEGIN SOLUTION
  model->to(setup.device);
  return std::make_unique<amplab::dist::DistributedDataParallel>(model, setup.comm, config);
  // END SOLUTION
}

amplab::EpochSampler make_sampler(int64_t dataset_size, int64_t batch_size_per_rank, uint64_t seed,
                                  const amplab::dist::WorldInfo& world) {
  // TODO(ddp-3): An amplab::EpochSampler over the dataset for this rank: shuffle, drop the last
  // short batch (every rank must run the same number of steps, or the others wait forever in an
  // all-reduce), rank = world.rank, world_size = world.world_size.
  // BEGIN SOLUTION
  return amplab::EpochSampler(dataset_size, batch_size_per_rank, seed, /*shuffle=*/true, /*drop_last=*/true,
                              world.rank, world.world_size);
  // END SOLUTION
}

amplab::RunDir make_run_dir(const amplab::RunConfig& run, const std::string& resolved_config_yaml,
                            const amplab::dist::WorldInfo& world) {
  // TODO(ddp-4): Rank 0 creates the run directory (amplab::RunDir::create(run, "ddp", yaml)).
  // Every other rank gets amplab::RunDir::none() and amplab::log::set_rank(rank), which limits
  // its console to warnings and errors, prefixed with its rank.
  // BEGIN SOLUTION
  if (world.is_main()) return amplab::RunDir::create(run, "ddp", resolved_config_yaml);
  amplab::log::set_rank(world.rank);
  return amplab::RunDir::none();
  // END SOLUTION
}

}  // namespace ddp_lab
