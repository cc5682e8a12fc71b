// Lab 5, data-parallel training: joining the job, sharding the data, the proof it worked. Each
// TODO below is one exercise; see labs/ddp/README.md. The gradient synchronization: naive.cpp, flat.cpp,
// overlapped.cpp, bucketed.cpp (and data_parallel.cpp, what they share).
#include "ddp_lab.hpp"

#include <string>
#include <vector>

#include "amplab/infra/config_json.hpp"  // first_config_difference
#include "amplab/infra/files.hpp"        // crc32_of, hex32

namespace ddp_lab {

// TODO(ddp-1): join the job. The launcher's environment has already been read and this rank's
// device chosen (cuda:LOCAL_RANK, one GPU per process, or the CPU) before your code runs, so
// `world` and `device` are given: connect to the other ranks with a communicator for that device
// (communicator.hpp), and keep all three in the Setup.
// Then make sure every rank runs the same resolved config (`resolved_config_yaml`, the text of
// config.yaml): a rank started with another --set trains another run, and worse, one with
// another batch size or model waits forever in an all-reduce the others never join. Every rank
// learns every rank's config (the communicator gathers bytes), compares it with rank 0's, and at
// the lowest rank that differs every rank throws the same amplab::Error, this message exactly:
//   ranks 0 and 1 were started with different configs (bench.batch is 64 on rank 0, 32 on
//   rank 1); start every rank with the same --config and --set
// amplab::first_config_difference (config_json.hpp) finds the key and both values. Where each
// node writes and what it logs may differ (two nodes, two disks): ignore run.out_dir and
// run.log_level. Pitfall: leave the group in order before you throw (shutdown()), so that rank 0,
// which hosts the rendezvous store, does not close it under ranks still reading from it.
Setup join_job(const amplab::dist::WorldInfo& world, torch::Device device, const amplab::dist::DistConfig& config,
               const std::string& resolved_config_yaml) {
  Setup setup;
  // BEGIN SOLUTION
  setup.world = world;
  setup.device = device;
  setup.comm = amplab::dist::make_communicator(world, config, device);
  const std::vector<std::string> configs = setup.comm->all_gather_bytes(resolved_config_yaml);
  for (size_t rank = 1; rank < configs.size(); ++rank) {
    if (configs[rank] == configs[0]) continue;
    const amplab::ConfigDifference d =
        amplab::first_config_difference(configs[0], configs[rank], {"run.out_dir", "run.log_level"});
    if (d.key.empty()) continue;
    setup.comm->shutdown();
    const std::string r = std::to_string(rank);
    throw amplab::Error("ranks 0 and " + r + " were started with different configs (" + d.key + " is " + d.before +
                        " on rank 0, " + d.now + " on rank " + r + "); start every rank with the same --config and --set");
  }
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

// TODO(ddp-3): the lab's proof that data-parallel training worked: after training, every rank
// must hold bit-identical parameters (same start, same averaged gradients, same optimizer steps).
// Fingerprint this rank's parameters: the CRC-32 (amplab::crc32_of, files.hpp) of all their bytes,
// in the module's order, as 8 hex digits (amplab::hex32). Every rank learns every rank's
// fingerprint, and all agree on the answer: identical when all equal rank 0's, and otherwise the
// lowest rank that differs.
// Pitfalls: a GPU tensor's bytes must come to the CPU first, contiguous; a sum or a norm of the
// parameters is no fingerprint (two values swapped, or an error that cancels, keep the sum);
// every parameter counts, the last one too.
ParameterCheck check_parameters_identical(amplab::dist::Communicator& comm, torch::nn::Module& model) {
  ParameterCheck check;
  // BEGIN SOLUTION
  std::string bytes;
  for (const auto& p : model.parameters()) {
    auto cpu = p.detach().to(torch::kCPU).contiguous();
    bytes.append(static_cast<const char*>(cpu.data_ptr()), cpu.nbytes());
  }
  check.fingerprint = amplab::hex32(amplab::crc32_of(bytes));
  const std::vector<std::string> all = comm.all_gather_bytes(check.fingerprint);
  for (size_t rank = 0; rank < all.size() && check.first_different_rank < 0; ++rank)
    if (all[rank] != all[0]) check.first_different_rank = static_cast<int>(rank);
  check.identical = check.first_different_rank < 0;
  // END SOLUTION
  return check;
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
