// Who this process is in a multi-process run, read from the environment that torchrun (or the
// project's launcher, amplab-run) gives each worker, and the distributed settings of a run.
// No torch here: the launcher's tests and the config code use it too.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <utility>

#include "amplab/infra/config.hpp"

namespace amplab::dist {

// torchrun's worker environment. Without WORLD_SIZE the process runs alone: rank 0 of 1.
struct WorldInfo {
  int rank = 0;              // RANK: this worker among all workers, [0, world_size)
  int local_rank = 0;        // LOCAL_RANK: this worker on its node, [0, local_world_size); picks the GPU
  int world_size = 1;        // WORLD_SIZE: workers in the whole job
  int local_world_size = 1;  // LOCAL_WORLD_SIZE: workers on this node
  int group_rank = 0;        // GROUP_RANK: this node's index, [0, nodes)
  std::string master_addr = "127.0.0.1";  // MASTER_ADDR: host of rank 0, which hosts the rendezvous store
  int master_port = 29500;                // MASTER_PORT: the store's TCP port
  // TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent already hosts the store at
  // MASTER_ADDR:MASTER_PORT, and every rank (rank 0 too) connects to it as a client.
  bool agent_store = false;
  int restart_count = 0;     // TORCHELASTIC_RESTART_COUNT: 0, then 1, 2... after restarts
  std::string run_id;        // TORCHELASTIC_RUN_ID ("" without torchrun)

  // More than one worker: gradients must be synchronized.
  bool is_distributed() const { return world_size > 1; }
  // Rank 0 writes the run directory, checkpoints and logs; the others only compute.
  bool is_main() const { return rank == 0; }
  // "rank 1 of 4 (local 1 of 2, node 0), store 127.0.0.1:29500", or "single process".
  std::string describe() const;
};

// Looks up one environment variable; returns nullptr when it is not set.
using EnvLookup = std::function<const char*(const char*)>;

// Reads the worker environment (std::getenv by default). When WORLD_SIZE is set, RANK,
// LOCAL_RANK and LOCAL_WORLD_SIZE must be too (GROUP_RANK defaults to RANK / LOCAL_WORLD_SIZE,
// MASTER_ADDR:MASTER_PORT to 127.0.0.1:29500). A missing or malformed variable is an
// amplab::Error naming it and the values it may take.
WorldInfo world_from_env();
WorldInfo world_from_env(const EnvLookup& lookup);

// How collectives are carried out.
enum class Backend {
  automatic,  // nccl when the run's device is a GPU, else cpu
  nccl,       // NVIDIA's library over NVLink/PCIe/network: the fast path for GPUs
  cpu,        // the project's own store-based collectives: for tests and small CPU runs
};
inline constexpr std::pair<Backend, const char*> kBackendNames[] = {
    {Backend::automatic, "auto"}, {Backend::nccl, "nccl"}, {Backend::cpu, "cpu"}};
inline std::span<const std::pair<Backend, const char*>> enum_names(Backend) { return kBackendNames; }

// The dtype gradients travel in.
enum class Compression {
  none,  // the parameters' own dtype (fp32): PyTorch DDP's default, an exact average
  bf16,  // bfloat16, half the bytes: PyTorch's bf16_compress_hook (each gradient rounded to bf16,
         // divided by the world size, summed in bf16, then written back in the parameter's dtype)
};
inline constexpr std::pair<Compression, const char*> kCompressionNames[] = {{Compression::none, "none"},
                                                                            {Compression::bf16, "bf16"}};
inline std::span<const std::pair<Compression, const char*>> enum_names(Compression) { return kCompressionNames; }

// Seconds a distributed wait may last: more than 0, at most a week.
inline constexpr Range<double> kTimeoutRange{0.0, 7 * 24 * 3600.0, true};

// The process group's settings, under `dist:` in a lab's YAML: what every multi-process lab sets
// (the collectives' backend, how long a rank waits, NCCL's stream). Ignored by single-process runs.
struct ProcessGroupConfig {
  Backend backend = Backend::automatic;
  double timeout_s = 300;
  double heartbeat_timeout_s = 15;
  bool nccl_high_priority = true;

  template <class V>
  void fields(V& v) {
    v.field("backend", backend, "collectives: auto (nccl on GPUs, else cpu), nccl, or cpu (tests, small CPU runs)");
    // At most a week: torch's store turns the timeout into integer milliseconds and poll()
    // timeouts, where 1e10 s overflowed into a rendezvous failure.
    v.field("timeout_s", timeout_s, "seconds a rank waits for the others (rendezvous, collectives) before failing",
            kTimeoutRange);
    v.field("heartbeat_timeout_s", heartbeat_timeout_s,
            "seconds without a sign of life from a rank (a heartbeat every 0.5 s) before the others stop, naming it "
            "(2 s once a rank was sent SIGINT/SIGTERM, as launchers do when a worker dies)",
            kTimeoutRange);
    v.field("nccl_high_priority", nccl_high_priority,
            "run NCCL's kernels on a high-priority CUDA stream, so that an all-reduce is not queued behind "
            "backward's kernels (PyTorch: TORCH_NCCL_HIGH_PRIORITY=1)");
  }
};

// The process group's settings and data parallelism's (the trainer's gradient sync, lab 5), under
// `dist:` in a lab's YAML.
struct DistConfig : ProcessGroupConfig {
  double bucket_mb = 25;
  bool overlap = true;
  bool broadcast_buffers = true;
  // Trainer::step does the per-bucket update.
  bool step_each_bucket = true;
  Compression compression = Compression::none;

  template <class V>
  void fields(V& v) {
    ProcessGroupConfig::fields(v);
    v.field("bucket_mb", bucket_mb, "MiB of gradients per all-reduce bucket (PyTorch DDP's bucket_cap_mb)",
            Range<double>::positive());
    v.field("overlap", overlap, "all-reduce buckets during backward (false: all after backward)");
    v.field("broadcast_buffers", broadcast_buffers,
            "broadcast rank 0's module buffers (e.g. BatchNorm's running statistics) before each forward");
    v.field("step_each_bucket", step_each_bucket,
            "with a fused optimizer and neither loss scaling nor clipping, update each bucket's parameters as soon as "
            "its all-reduce is done (same result, the update overlaps the later all-reduces)");
    v.field("compression", compression,
            "dtype gradients travel in: none (the parameters' own, an exact average, PyTorch DDP's default) or bf16 "
            "(half the bytes, the result of PyTorch's bf16_compress_hook)");
  }
};

}  // namespace amplab::dist
