// Lab 5, data-parallel training: the functions and classes you implement (starter/ddp/*.cpp).
// The lab binary (apps/ddp) runs one process per GPU (or CPU processes), launched by amplab-run or
// torchrun --no-python; tests/labs/ddp_test.cpp grades your code, on CPU ranks, and on two GPUs
// where there are two. The gradient synchronization itself, in four steps: data_parallel.hpp.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <span>
#include <string>
#include <utility>

#include "amplab/data/sampler.hpp"
#include "amplab/dist/communicator.hpp"
#include "amplab/dist/world.hpp"
#include "amplab/infra/error.hpp"  // AMPLAB_TODO in the starter
#include "data_parallel.hpp"

namespace ddp_lab {

// This process's place in the job and its way to talk to the others.
struct Setup {
  amplab::dist::WorldInfo world;                     // decided before the lab's code runs (lab_main)
  torch::Device device{torch::kCPU};                 // cuda:LOCAL_RANK on GPUs, else the CPU (lab_main)
  std::shared_ptr<amplab::dist::Communicator> comm;  // NCCL between GPUs, the CPU backend otherwise
};

// TODO(ddp-1): connect to the other ranks, then make sure every rank runs the same config.
Setup join_job(const amplab::dist::WorldInfo& world, torch::Device device, const amplab::dist::DistConfig& config,
               const std::string& resolved_config_yaml);

// TODO(ddp-2): this rank's shard of each epoch (disjoint across ranks, reshuffled per epoch from
// a seed all ranks share).
amplab::EpochSampler make_sampler(int64_t dataset_size, int64_t batch_size_per_rank, uint64_t seed,
                                  const amplab::dist::WorldInfo& world);

// TODO(ddp-3): the proof that data-parallel training worked: whether every rank holds the same
// parameters, bit for bit. A collective: every rank calls it.
struct ParameterCheck {
  bool identical = false;
  std::string fingerprint;      // this rank's: the CRC-32 of its parameters' bytes, 8 hex digits
  int first_different_rank = -1;  // the lowest rank whose fingerprint is not rank 0's (-1: none)
};
ParameterCheck check_parameters_identical(amplab::dist::Communicator& comm, torch::nn::Module& model);

// The four versions of gradient synchronization (dist.sync).
enum class SyncKind { naive, flat, overlapped, bucketed };
inline constexpr std::pair<SyncKind, const char*> kSyncKindNames[] = {
    {SyncKind::naive, "naive"}, {SyncKind::flat, "flat"}, {SyncKind::overlapped, "overlapped"}, {SyncKind::bucketed, "bucketed"}};
inline std::span<const std::pair<SyncKind, const char*>> enum_names(SyncKind) { return kSyncKindNames; }

// The lab's dist: section: the core's settings (amplab::dist::DistConfig) and which version runs.
struct LabDistConfig : amplab::dist::DistConfig {
  SyncKind sync = SyncKind::bucketed;

  template <class V>
  void fields(V& v) {
    amplab::dist::DistConfig::fields(v);
    v.field("sync", sync,
            "gradient synchronization: naive (an all-reduce per gradient after backward), flat (one all-reduce "
            "after backward), overlapped (an all-reduce per gradient, during backward), bucketed (buckets during "
            "backward, PyTorch's DDP; the bucket and compression keys above are its)");
  }
};

// Given: moves the model to setup.device and wraps it in the version `kind` (the constructor
// checks that every rank holds the same model and copies rank 0's weights).
std::unique_ptr<DataParallel> make_gradient_sync(SyncKind kind, std::shared_ptr<torch::nn::Module> model,
                                                 const Setup& setup, const amplab::dist::DistConfig& config);

}  // namespace ddp_lab
