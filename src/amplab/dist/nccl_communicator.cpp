// The nccl backend: c10d::ProcessGroupNCCL on cuda:LOCAL_RANK, over rank 0's TCPStore.
//
// Collectives run on NCCL's own CUDA stream: all_reduce_sum returns at once, and Work::wait()
// makes the *current* stream wait for the result (the host does not block), which is what lets
// DDP overlap communication with backward. Metadata (all_gather_bytes) and barrier() go through
// the store, on the host.
//
// Timeouts: the rendezvous (and all_gather_bytes/barrier) fail with an amplab::Error naming the
// missing ranks. A GPU collective that exceeds dist.timeout_s is caught by torch's NCCL watchdog,
// which logs the collective and aborts the process (TORCH_NCCL_ASYNC_ERROR_HANDLING's default);
// the launcher then stops the other ranks and names the one that failed.
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <map>
#include <optional>

#include "amplab/dist/backends.hpp"
#include "amplab/dist/rendezvous.hpp"
#include "amplab/infra/error.hpp"
#include "amplab/infra/log.hpp"

namespace amplab::dist::detail {

namespace {

std::string first_line(const c10::Error& e) {
  std::string message = e.what_without_backtrace();
  return message.substr(0, message.find('\n'));
}

class NcclWork final : public Work {
 public:
  NcclWork(c10::intrusive_ptr<c10d::Work> work, std::string what) : work_(std::move(work)), what_(std::move(what)) {}
  void wait() override {
    try {
      work_->wait();
    } catch (const c10::Error& e) {
      throw Error(what_ + ": " + first_line(e));
    }
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::string what_;
};

// Work queued on a side stream: wait() makes the current stream wait for it.
class SideStreamWork final : public Work {
 public:
  explicit SideStreamWork(std::shared_ptr<at::cuda::CUDAEvent> done) : done_(std::move(done)) {}
  void wait() override { done_->block(c10::cuda::getCurrentCUDAStream(done_->device_index())); }

 private:
  std::shared_ptr<at::cuda::CUDAEvent> done_;
};

// Several collectives in flight as one: wait() waits for each.
class WorkGroup final : public Work {
 public:
  explicit WorkGroup(std::vector<std::shared_ptr<Work>> works) : works_(std::move(works)) {}
  void wait() override {
    for (auto& w : works_) w->wait();
  }

 private:
  std::vector<std::shared_ptr<Work>> works_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const WorldInfo& world, const ProcessGroupConfig& config)
      : world_(world),
        timeout_(to_timeout(config.timeout_s)),
        device_(torch::kCUDA, static_cast<c10::DeviceIndex>(world.local_rank)) {
    int visible = c10::cuda::device_count();
    if (world.local_rank >= visible) {
      throw Error("rank " + std::to_string(world.rank) + " has LOCAL_RANK=" + std::to_string(world.local_rank) +
                  " but this node sees " + std::to_string(visible) +
                  " GPU(s): start at most that many workers per node (amplab-run --nproc-per-node), or check "
                  "CUDA_VISIBLE_DEVICES");
    }
    c10::cuda::set_device(device_.index());
    copy_stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device_.index());

    store_ = connect_store(world_, timeout_);
    heartbeat_ = std::make_unique<Heartbeat>(store_, world_);
    // Our own connection to the store, apart from the one NCCL's process group uses.
    exchange_ = std::make_unique<StoreExchange>(store_->clone(), world_, timeout_, "amplab/meta/", heartbeat_.get(),
                                                to_timeout(config.heartbeat_timeout_s));
    exchange_->barrier("joining the process group (rendezvous at " + world_.master_addr + ":" +
                           std::to_string(world_.master_port) + ")",
                       StoreExchange::kJoinHint);

    // A high-priority stream: the block scheduler starts an all-reduce's kernels ahead of queued
    // backward kernels, so the last buckets finish sooner (0.2 ms a step in lab 5's bench on two
    // H200s).
    auto options = c10d::ProcessGroupNCCL::Options::create(config.nccl_high_priority);
    options->timeout = timeout_;
    try {
      group_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(c10::make_intrusive<c10d::PrefixStore>("amplab/nccl/", store_),
                                                           world_.rank, world_.world_size, options);
      // Create the NCCL communicator now rather than at the first collective, so set-up
      // problems (driver, topology, a missing peer) surface here, with a clear message.
      group_->setBoundDeviceId(device_);
      group_->eagerConnectSingleDevice(device_);
    } catch (const c10::Error& e) {
      throw Error("rank " + std::to_string(world_.rank) + " could not set up NCCL on " + device_.str() + ": " +
                  first_line(e) + " (NCCL_DEBUG=INFO shows why)");
    }
    watchdog_ = std::thread([this, dead = to_timeout(config.heartbeat_timeout_s)] { watch(dead); });
  }

  ~NcclCommunicator() override {
    stop_watchdog_.store(true);
    if (watchdog_.joinable()) watchdog_.join();
    try {
      finish(/*wait_for_others=*/std::uncaught_exceptions() == 0);
    } catch (...) {
    }
  }

  int rank() const override { return world_.rank; }
  int size() const override { return world_.world_size; }
  std::string backend() const override { return "nccl"; }
  torch::Device device() const override { return device_; }

  std::shared_ptr<Work> all_reduce_sum(std::vector<torch::Tensor> tensors) override {
    return all_reduce(std::move(tensors), c10d::ReduceOp::SUM, "all-reduce");
  }

  std::shared_ptr<Work> all_reduce_mean(std::vector<torch::Tensor> tensors) override {
    for (const auto& t : tensors)
      if (!t.is_floating_point()) return Communicator::all_reduce_mean(std::move(tensors));
    return all_reduce(std::move(tensors), c10d::ReduceOp::AVG, "all-reduce (mean)");
  }

  std::shared_ptr<Work> all_reduce(std::vector<torch::Tensor> tensors, c10d::ReduceOp::RedOpType op, const char* name) {
    check_device(tensors, name);
    // A coalesced NCCL call takes one dtype: tensors of several dtypes go as one call per dtype.
    std::map<c10::ScalarType, std::vector<torch::Tensor>> by_dtype;
    for (const auto& t : tensors) by_dtype[t.scalar_type()].push_back(t);
    if (by_dtype.size() > 1) {
      std::vector<std::shared_ptr<Work>> works;
      for (auto& [dtype, group] : by_dtype) works.push_back(all_reduce(group, op, name));
      return std::make_shared<WorkGroup>(std::move(works));
    }
    std::string what = std::string("nccl ") + name + " #" + std::to_string(++issued_);
    try {
      c10d::AllreduceOptions options;
      options.reduceOp = op;
      if (tensors.size() == 1) return std::make_shared<NcclWork>(group_->allreduce(tensors, options), what);
      c10d::AllreduceCoalescedOptions coalesced;
      coalesced.reduceOp = op;
      return std::make_shared<NcclWork>(group_->allreduce_coalesced(tensors, coalesced), what);
    } catch (const c10::Error& e) {
      throw Error(what + ": " + first_line(e));
    }
  }

  // The copy runs on a side stream of ours that waits for the collective, not on the caller's
  // stream, which goes on with its own work (backward's kernels) meanwhile. `from` and `to` are
  // the caller's: it keeps them alive until it has waited on the result.
  std::shared_ptr<Work> then_copy(std::shared_ptr<Work> work, std::vector<torch::Tensor> from,
                                  std::vector<torch::Tensor> to) override {
    check_copy_pairs(from, to);
    check_device(from, "then_copy");
    check_device(to, "then_copy");
    c10::cuda::CUDAStreamGuard on_side(*copy_stream_);
    work->wait();  // the side stream waits for the collective
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < to.size(); ++i) to[i].copy_(from[i]);
    }
    auto done = std::make_shared<at::cuda::CUDAEvent>(cudaEventDisableTiming);
    done->record(*copy_stream_);
    return std::make_shared<SideStreamWork>(std::move(done));
  }

  // NCCL's own reduce-scatter and all-gather (c10d's "_base" calls: one flat tensor each side);
  // in place is NCCL's in place, an output that is chunk `rank` of the input.
  std::shared_ptr<Work> reduce_scatter(torch::Tensor output, torch::Tensor input, Reduction op) override {
    check_device({output, input}, "reduce_scatter");
    check_whole_and_part(input, output, "reduce_scatter", op);
    std::string what = "nccl reduce-scatter #" + std::to_string(++issued_);
    try {
      c10d::ReduceScatterOptions options;
      options.reduceOp = op == Reduction::mean ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM;
      return std::make_shared<NcclWork>(group_->_reduce_scatter_base(output, input, options), what);
    } catch (const c10::Error& e) {
      throw Error(what + ": " + first_line(e));
    }
  }

  std::shared_ptr<Work> all_gather(torch::Tensor output, torch::Tensor input) override {
    check_device({output, input}, "all_gather");
    check_whole_and_part(output, input, "all_gather");
    std::string what = "nccl all-gather #" + std::to_string(++issued_);
    try {
      return std::make_shared<NcclWork>(group_->_allgather_base(output, input), what);
    } catch (const c10::Error& e) {
      throw Error(what + ": " + first_line(e));
    }
  }

  void broadcast(std::vector<torch::Tensor> tensors, int root) override {
    check_device(tensors, "broadcast");
    std::string what = "nccl broadcast #" + std::to_string(++issued_) + " from rank " + std::to_string(root);
    torch::NoGradGuard no_grad;  // the tensors are often parameters
    c10d::BroadcastOptions options;
    options.rootRank = root;
    // One broadcast per dtype: the tensors of a dtype travel as one flat buffer, which matters
    // when a model has many small buffers (BatchNorm's statistics).
    std::map<c10::ScalarType, std::vector<torch::Tensor>> by_dtype;
    for (const auto& t : tensors) by_dtype[t.scalar_type()].push_back(t);
    try {
      for (auto& [dtype, group] : by_dtype) {
        if (group.size() == 1 && group[0].is_contiguous()) {  // in place, no copies
          group_->broadcast(group, options)->wait();
          continue;
        }
        std::vector<torch::Tensor> pieces;
        for (const auto& t : group) pieces.push_back(t.reshape({-1}));
        std::vector<torch::Tensor> flat{torch::cat(pieces)};
        group_->broadcast(flat, options)->wait();
        if (world_.rank == root) continue;
        int64_t offset = 0;
        for (auto& t : group) {
          t.copy_(flat[0].narrow(0, offset, t.numel()).view(t.sizes()));
          offset += t.numel();
        }
      }
    } catch (const c10::Error& e) {
      throw Error(what + ": " + first_line(e));
    }
  }

  std::vector<std::string> all_gather_bytes(const std::string& mine) override {
    return exchange_->all_gather("nccl all-gather (host) #" + std::to_string(++host_issued_), mine);
  }

  void barrier() override { exchange_->barrier("nccl barrier (host) #" + std::to_string(++host_issued_)); }

  void shutdown() override { finish(/*wait_for_others=*/true); }

  int64_t store_key_count() override { return exchange_->key_count(); }

 private:
  void check_device(const std::vector<torch::Tensor>& tensors, const char* op) const {
    for (const auto& t : tensors) {
      if (!t.defined()) throw Error(std::string("nccl backend ") + op + ": got an undefined tensor");
      if (t.device() != device_) {
        throw Error(std::string("nccl backend ") + op + ": got a tensor on " + t.device().str() + ", but rank " +
                    std::to_string(world_.rank) + " communicates on " + device_.str() +
                    " (cuda:LOCAL_RANK): move the model and data there");
      }
    }
  }

  // A GPU collective with a dead peer never ends, and the host waits for it somewhere (a loss
  // read back, the next step's copy) where no error can reach it. So a thread of its own watches
  // the others' heartbeats; when one stops, it aborts NCCL and ends the process with one line
  // naming the rank (nothing is saved: the last checkpoint stays the last good one).
  void watch(std::chrono::milliseconds dead) {
    std::vector<int> others;
    for (int r = 0; r < world_.world_size; ++r)
      if (r != world_.rank) others.push_back(r);
    while (!stop_watchdog_.load()) {
      std::this_thread::sleep_for(Heartbeat::kPeriod);
      std::vector<int> silent;
      try {
        silent = heartbeat_->silent(others, dead_after(dead));
      } catch (const std::exception&) {
        silent = {0};  // the store is gone: rank 0, which hosts it, has exited
      }
      if (silent.empty() || stop_watchdog_.load()) continue;
      std::string message = "error: rank " + std::to_string(world_.rank) + ": " + format_ranks(silent) +
                            " stopped responding (no sign of life for " + format_seconds(dead_after(dead)) +
                            "; it probably died, see its output); aborting NCCL and exiting (the last checkpoint is "
                            "the last good one)";
      log::error_to_file(message);
      log::flush();
      std::fprintf(stderr, "%s\n", message.c_str());
      try {
        group_->abort();
      } catch (...) {
      }
      std::_Exit(1);
    }
  }

  void finish(bool wait_for_others) {
    if (finished_) return;
    finished_ = true;
    stop_watchdog_.store(true);
    if (watchdog_.joinable() && watchdog_.get_id() != std::this_thread::get_id()) watchdog_.join();
    heartbeat_->leave();
    group_->shutdown();  // waits for queued collectives, then frees NCCL's communicators
    exchange_->leave(wait_for_others);
  }

  WorldInfo world_;
  std::chrono::milliseconds timeout_;
  torch::Device device_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::unique_ptr<Heartbeat> heartbeat_;
  std::unique_ptr<StoreExchange> exchange_;
  std::thread watchdog_;
  std::atomic<bool> stop_watchdog_{false};
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> group_;
  std::optional<c10::cuda::CUDAStream> copy_stream_;  // then_copy's side stream
  std::atomic<int64_t> issued_{0};  // GPU collectives issued (for messages); DDP issues from autograd's thread
  int64_t host_issued_ = 0;         // store-based ones
  bool finished_ = false;
};

}  // namespace

std::shared_ptr<Communicator> make_nccl_communicator(const WorldInfo& world, const ProcessGroupConfig& config) {
  return std::make_shared<NcclCommunicator>(world, config);
}

}  // namespace amplab::dist::detail
