// Lab 5, data-parallel training: joining the job, sharding the data, one writer. Each TODO below
// is one exercise; see labs/ddp/README.md. The gradient synchronization: naive.cpp, flat.cpp,
// overlapped.cpp, bucketed.cpp (and data_parallel.cpp, what they share).
#include "ddp_lab.hpp"

#include "amplab/infra/device.hpp"
#include "amplab/infra/log.hpp"

namespace ddp_lab {

// TODO(ddp-1): this rank's Setup. The job comes from torchrun's environment (amplab::dist has a
// reader that explains a missing or bad variable). The device: the CPU when device_spec is "cpu",
// or when it is "auto" on a machine without a GPU; otherwise the GPU numbered like this process on
// its node (one process per GPU), and asking for "cuda" where there is none is an error that says
// so (amplab's device code has one). Then connect to the other ranks with a communicator for that
// device (communicator.hpp).
Setup init_distributed(const amplab::dist::DistConfig& config, const std::string& device_spec) {
  Setup setup;
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

// TODO(ddp-2): an amplab::EpochSampler over the dataset for this rank (sampler.hpp): shuffled, and
// every rank must run the same number of steps per epoch (a rank with one batch more waits
// forever in its extra all-reduce): drop the short last batch.
amplab::EpochSampler make_sampler(int64_t dataset_size, int64_t batch_size_per_rank, uint64_t seed,
                                  const amplab::dist::WorldInfo& world) {
  // BEGIN SOLUTION
  return amplab::EpochSampler(dataset_size, batch_size_per_rank, seed, /*shuffle=*/true, /*drop_last=*/true,
                              world.rank, world.world_size);
  // END SOLUTION
}

// TODO(ddp-3): rank 0 creates the run directory (run_dir.hpp; the lab is "ddp"). Every other rank
// gets none, and its console shows only warnings and errors, prefixed with its rank (log.hpp).
amplab::RunDir make_run_dir(const amplab::RunConfig& run, const std::string& resolved_config_yaml,
                            const amplab::dist::WorldInfo& world) {
  // BEGIN SOLUTION
  if (world.is_main()) return amplab::RunDir::create(run, "ddp", resolved_config_yaml);
  amplab::log::set_rank(world.rank);
  return amplab::RunDir::none();
  // END SOLUTION
}

std::unique_ptr<DataParallel> make_gradient_sync(SyncKind kind, std::shared_ptr<torch::nn::Module> model,
                                                 const Setup& setup, const amplab::dist::DistConfig& config) {
  model->to(setup.device);
  switch (kind) {
    case SyncKind::naive:
      return std::make_unique<NaiveDdp>(model, setup.comm, config);
    case SyncKind::flat:
      return std::make_unique<FlatDdp>(model, setup.comm, config);
    case SyncKind::overlapped:
      return std::make_unique<OverlappedDdp>(model, setup.comm, config);
    case SyncKind::bucketed:
      return std::make_unique<BucketedDdp>(model, setup.comm, config);
  }
  throw amplab::Error("unknown dist.sync");
}

}  // namespace ddp_lab
