// The collectives that DDP and the labs use, behind one small interface, with three backends:
//
//   nccl    c10d::ProcessGroupNCCL, one GPU per rank (cuda:LOCAL_RANK): the fast path.
//   cpu     the project's own collectives over c10d::TCPStore (the torch wheel ships no gloo
//           headers): correct for any world size and deterministic (every rank gets the same
//           bits), but every byte goes through rank 0's store. For tests and small CPU runs.
//   single  world size 1: every collective is a no-op, so code needs no special case.
//
// All ranks rendezvous at rank 0's TCPStore (MASTER_ADDR:MASTER_PORT). Nothing waits forever:
// a rank that dies or never arrives makes the others fail within ProcessGroupConfig::timeout_s with an
// amplab::Error naming the operation and the missing ranks.
//
// Rules for callers, as with torch.distributed: every rank makes the same collective calls in
// the same order, with tensors of the same count, dtypes and shapes, on device().
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "amplab/dist/world.hpp"

namespace amplab::dist {

// How reduce_scatter combines the ranks' chunks.
enum class Reduction { sum, mean };

// A collective in flight.
class Work {
 public:
  virtual ~Work() = default;
  // Returns once the result may be used by work queued after this call: on the CPU the tensors
  // hold it; with NCCL the current CUDA stream waits for it (the host does not block).
  // Throws amplab::Error when the collective failed (a rank left, timed out, sent other shapes).
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "nccl", "cpu" or "single"
  // Where the tensors passed to collectives must live: cuda:LOCAL_RANK for nccl, else cpu.
  virtual torch::Device device() const = 0;

  // Every collective keeps its tensors alive until it has completed: a caller may drop its own
  // references to an input once the call returns (the memory is reused only after the collective).
  //
  // Sums each tensor in place across ranks, asynchronously: call wait() on the result before
  // reading the tensors, and do not write to them before that.
  virtual std::shared_ptr<Work> all_reduce_sum(std::vector<torch::Tensor> tensors) = 0;
  // The same, divided by the world size. By default each tensor is divided before the sum (one
  // pass over the data); NCCL averages inside the reduction instead (ncclAvg), saving that pass.
  virtual std::shared_ptr<Work> all_reduce_mean(std::vector<torch::Tensor> tensors) {
    for (auto& t : tensors) t.div_(size());
    return all_reduce_sum(std::move(tensors));
  }
  // Once `work` is done, copies each `from` into its `to` (converting the dtype); wait() on the result
  // covers both. NCCL does the copy on a side stream that waits for the collective, so that it
  // runs beside whatever the caller queues next (DDP writes bf16-compressed gradients back into
  // fp32 this way while backward goes on); the default does it in wait().
  virtual std::shared_ptr<Work> then_copy(std::shared_ptr<Work> work, std::vector<torch::Tensor> from,
                                          std::vector<torch::Tensor> to);
  // Reduce-scatter, asynchronously (wait() before reading `output`). `input` is size() equal
  // chunks laid end to end (input.numel() == size() * output.numel()); rank r's `output` becomes
  // the sum (or mean) over the ranks of their chunk r. `output` may be chunk rank() of `input`
  // itself (in place). A length that does not divide by the world size is the caller's to pad:
  // see shard_numel. Both tensors contiguous, of one floating dtype for a mean.
  virtual std::shared_ptr<Work> reduce_scatter(torch::Tensor output, torch::Tensor input,
                                               Reduction op = Reduction::sum) = 0;
  // All-gather, asynchronously: `output` is size() chunks of input.numel() elements, and chunk r
  // becomes rank r's `input`. `input` may be chunk rank() of `output` itself (in place).
  virtual std::shared_ptr<Work> all_gather(torch::Tensor output, torch::Tensor input) = 0;
  // Copies rank `root`'s tensors into every rank's tensors (in place); returns when done.
  virtual void broadcast(std::vector<torch::Tensor> tensors, int root) = 0;
  // Every rank's bytes, indexed by rank. For small metadata (parameter names and shapes), not
  // for tensors: it goes through the store on every backend.
  virtual std::vector<std::string> all_gather_bytes(const std::string& mine) = 0;
  // Returns once every rank has reached it (host-side only; it does not wait for GPU work).
  virtual void barrier() = 0;

  // Leaves the group in order: waits for pending collectives, then rank 0 (which hosts the
  // store) waits until the others have left before closing it, so no rank loses the store
  // mid-operation. The destructor calls it too, but an explicit call lets errors surface.
  virtual void shutdown() {}

  // For tests: how many keys the rendezvous store holds now (-1 when there is no store). The
  // cpu backend deletes each collective's keys once every rank has read them.
  virtual int64_t store_key_count() { return -1; }

 protected:
  // then_copy's argument check, for the backends that override it.
  static void check_copy_pairs(const std::vector<torch::Tensor>& from, const std::vector<torch::Tensor>& to);
  // reduce_scatter's and all_gather's argument check: `whole` has size() chunks of `part`'s
  // numel, both defined, contiguous and of one dtype (floating for a mean). `op` names the call.
  void check_whole_and_part(const torch::Tensor& whole, const torch::Tensor& part, const char* op,
                            Reduction reduction = Reduction::sum) const;
};

// The backend that `config.backend` resolves to for a run on `run_device` ("single" when the
// world has one process).
std::string resolve_backend(const WorldInfo& world, const ProcessGroupConfig& config, torch::Device run_device);

// Joins the process group described by `world`: rank 0 hosts the TCPStore, all ranks meet there
// (an amplab::Error names the ranks that did not arrive within the timeout), then the backend
// is set up. For nccl, the current CUDA device becomes cuda:LOCAL_RANK.
std::shared_ptr<Communicator> make_communicator(const WorldInfo& world, const ProcessGroupConfig& config,
                                                torch::Device run_device);

// The length of each rank's shard when `numel` elements are cut into `world_size` equal pieces:
// numel / world_size rounded up. The last shards may then hold padding (world_size * shard_numel
// - numel elements), which the caller keeps at zero and leaves out of what it reads back.
int64_t shard_numel(int64_t numel, int world_size);

// The mean of `value` (any shape) across ranks, for logging metrics such as the loss. Floating
// tensors keep their dtype; others become float64. Waits for the result.
torch::Tensor mean_across_ranks(Communicator& comm, const torch::Tensor& value);

}  // namespace amplab::dist
