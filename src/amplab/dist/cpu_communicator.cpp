// The cpu backend: collectives on CPU tensors built on the rendezvous store, for tests and
// small CPU runs (the torch wheel ships no gloo headers, so ProcessGroupGloo is out of reach).
//
// How it works: every collective is one StoreExchange round. An all-reduce posts this rank's
// bytes, reads every other rank's, and sums them in rank order (r0 + r1 + r2 ...). All ranks
// add the same numbers in the same order, so they all get the same bits, whatever the world
// size. The price is speed: each rank uploads its tensor once and downloads W - 1 of them, all
// through rank 0's store, so traffic grows with W^2. Fine for MLPs on a few processes.
//
// Collectives run on one worker thread, in the order they were issued, so all_reduce_sum can
// return at once and DDP's backward keeps computing while buckets travel. A failed collective
// (a timeout, a lost rank) fails every later one too: the ranks no longer agree on the order.
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "amplab/dist/backends.hpp"
#include "amplab/dist/rendezvous.hpp"
#include "amplab/infra/error.hpp"

namespace amplab::dist::detail {

namespace {

class CpuWork final : public Work {
 public:
  explicit CpuWork(std::shared_future<void> done) : done_(std::move(done)) {}
  void wait() override { done_.get(); }

 private:
  std::shared_future<void> done_;
};

// The bytes of a tensor, in its logical (contiguous) order.
void append_bytes(std::string& out, const torch::Tensor& t) {
  auto c = t.contiguous();
  out.append(static_cast<const char*>(c.data_ptr()), c.nbytes());
}

size_t byte_size(const torch::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

// A tensor shaped like `like` over `bytes` (not copied: the caller keeps `bytes` alive).
torch::Tensor tensor_over(std::string& bytes, size_t offset, const torch::Tensor& like) {
  return torch::from_blob(bytes.data() + offset, like.sizes(), torch::TensorOptions().dtype(like.scalar_type()));
}

class CpuCommunicator final : public Communicator {
 public:
  CpuCommunicator(const WorldInfo& world, const ProcessGroupConfig& config)
      : world_(world), timeout_(to_timeout(config.timeout_s)) {
    store_ = connect_store(world_, timeout_);
    heartbeat_ = std::make_unique<Heartbeat>(store_, world_);
    exchange_ = std::make_unique<StoreExchange>(store_, world_, timeout_, "amplab/cpu/", heartbeat_.get(),
                                                to_timeout(config.heartbeat_timeout_s));
    exchange_->barrier("joining the process group (rendezvous at " + world_.master_addr + ":" +
                           std::to_string(world_.master_port) + ")",
                       StoreExchange::kJoinHint);
    worker_ = std::thread([this] { run_worker(); });
  }

  ~CpuCommunicator() override {
    try {
      // While an exception unwinds (this rank is failing), rank 0 must not wait a whole timeout
      // for the others to leave: they will fail on their own once its store is gone.
      finish(/*wait_for_others=*/std::uncaught_exceptions() == 0);
    } catch (...) {
    }
  }

  int rank() const override { return world_.rank; }
  int size() const override { return world_.world_size; }
  std::string backend() const override { return "cpu"; }
  torch::Device device() const override { return torch::kCPU; }

  std::shared_ptr<Work> all_reduce_sum(std::vector<torch::Tensor> tensors) override {
    check_cpu(tensors, "all_reduce_sum");
    return submit("all-reduce", [this, tensors = std::move(tensors)](const std::string& what) {
      run_all_reduce(what, tensors);
    });
  }

  std::shared_ptr<Work> reduce_scatter(torch::Tensor output, torch::Tensor input, Reduction op) override {
    check_cpu({output, input}, "reduce_scatter");
    check_whole_and_part(input, output, "reduce_scatter", op);
    return submit("reduce-scatter", [this, output, input, op](const std::string& what) {
      run_reduce_scatter(what, output, input, op);
    });
  }

  std::shared_ptr<Work> all_gather(torch::Tensor output, torch::Tensor input) override {
    check_cpu({output, input}, "all_gather");
    check_whole_and_part(output, input, "all_gather");
    return submit("all-gather (tensor)", [this, output, input](const std::string& what) {
      run_all_gather(what, output, input);
    });
  }

  void broadcast(std::vector<torch::Tensor> tensors, int root) override {
    check_cpu(tensors, "broadcast");
    TORCH_CHECK(root >= 0 && root < world_.world_size, "broadcast: root ", root, " is not a rank");
    submit("broadcast from rank " + std::to_string(root), [this, root, tensors = std::move(tensors)](const std::string& what) {
      run_broadcast(what, tensors, root);
    })->wait();
  }

  std::vector<std::string> all_gather_bytes(const std::string& mine) override {
    auto result = std::make_shared<std::vector<std::string>>();
    submit("all-gather", [this, mine, result](const std::string& what) { *result = exchange_->all_gather(what, mine); })
        ->wait();
    return std::move(*result);
  }

  void barrier() override {
    submit("barrier", [this](const std::string& what) { exchange_->barrier(what); })->wait();
  }

  void shutdown() override { finish(/*wait_for_others=*/true); }

  int64_t store_key_count() override {
    auto count = std::make_shared<int64_t>(-1);
    submit("counting store keys", [this, count](const std::string&) { *count = exchange_->key_count(); },
           /*collective=*/false)
        ->wait();
    return *count;
  }

 private:
  struct Job {
    std::string what;  // "cpu collective #7 (all-reduce)", for messages
    std::function<void(const std::string& what)> run;
    std::promise<void> done;
    bool collective = true;  // false: local bookkeeping (leaving, counting keys), which runs even after a failure
  };

  void check_cpu(const std::vector<torch::Tensor>& tensors, const char* op) const {
    for (const auto& t : tensors) {
      if (!t.defined()) throw Error(std::string("cpu backend ") + op + ": got an undefined tensor");
      if (!t.device().is_cpu()) {
        throw Error(std::string("cpu backend ") + op + ": got a tensor on " + t.device().str() +
                    "; the cpu backend exchanges CPU tensors only: use dist.backend=nccl (or auto) for GPU runs");
      }
    }
  }

  // Queues `run` for the worker thread. Collectives are numbered in the order they are issued
  // ("cpu collective #7 (all-reduce)"): the same call has the same number on every rank, which
  // is what to compare in the ranks' messages when they disagree.
  std::shared_ptr<Work> submit(const std::string& kind, std::function<void(const std::string&)> run,
                               bool collective = true) {
    Job job{"", std::move(run), std::promise<void>{}, collective};
    auto done = job.done.get_future().share();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job.what = collective ? "cpu collective #" + std::to_string(++issued_) + " (" + kind + ")" : kind;
      if (stopping_) throw Error(job.what + ": the communicator was shut down");
      queue_.push_back(std::move(job));
    }
    wake_.notify_one();
    return std::make_shared<CpuWork>(std::move(done));
  }

  void run_worker() {
    torch::NoGradGuard no_grad;  // broadcasts write into parameters, which require grad
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr error;
      try {
        if (!failure_.empty() && job.collective)
          throw Error(job.what + " was not run: an earlier collective failed: " + failure_);
        job.run(job.what);
      } catch (const Error&) {
        error = std::current_exception();
      } catch (const c10::Error& e) {
        std::string message = e.what_without_backtrace();
        error = std::make_exception_ptr(Error(job.what + ": " + message.substr(0, message.find('\n'))));
      } catch (const std::exception& e) {
        error = std::make_exception_ptr(Error(job.what + ": " + e.what()));
      }
      // The collective's tensors go before its waiters wake: once wait() returns, the collective
      // holds no reference to them (a caller that dropped its own sees the memory freed).
      job.run = nullptr;
      if (!error) {
        job.done.set_value();
        continue;
      }
      if (failure_.empty()) {
        try {
          std::rethrow_exception(error);
        } catch (const std::exception& e) {
          failure_ = e.what();
        }
      }
      job.done.set_exception(error);
    }
  }

  void run_all_reduce(const std::string& what, const std::vector<torch::Tensor>& tensors) {
    std::string mine;
    for (const auto& t : tensors) append_bytes(mine, t);
    std::vector<std::string> all = exchange_same_sizes(what, mine);
    // Sum in rank order on every rank: identical inputs, identical order, identical bits.
    size_t offset = 0;
    for (const auto& t : tensors) {
      torch::Tensor sum = tensor_over(all[0], offset, t).clone();
      for (int r = 1; r < world_.world_size; ++r) sum.add_(tensor_over(all[r], offset, t));
      t.copy_(sum);
      offset += byte_size(t);
    }
  }

  // Every rank's bytes, each checked to be as long as this rank's.
  std::vector<std::string> exchange_same_sizes(const std::string& what, const std::string& mine) {
    std::vector<std::string> all = exchange_->all_gather(what, mine);
    for (int r = 0; r < world_.world_size; ++r) {
      if (all[r].size() != mine.size()) {
        throw Error(what + ": rank " + std::to_string(r) + " sent " + std::to_string(all[r].size()) + " bytes but rank " +
                    std::to_string(world_.rank) + " sent " + std::to_string(mine.size()) +
                    ": the ranks passed tensors of different sizes or dtypes");
      }
    }
    return all;
  }

  // Each rank posts its whole input and sums chunk `rank` of everyone's, in rank order: the bits
  // of the same chunk of an all-reduce. (Traffic is the whole input per rank, as for all-reduce.)
  void run_reduce_scatter(const std::string& what, torch::Tensor output, const torch::Tensor& input, Reduction op) {
    std::string mine;
    append_bytes(mine, input);
    std::vector<std::string> all = exchange_same_sizes(what, mine);
    size_t offset = static_cast<size_t>(world_.rank) * byte_size(output);
    torch::Tensor sum = tensor_over(all[0], offset, output).clone();
    for (int r = 1; r < world_.world_size; ++r) sum.add_(tensor_over(all[r], offset, output));
    if (op == Reduction::mean) sum.div_(world_.world_size);
    output.copy_(sum);
  }

  void run_all_gather(const std::string& what, torch::Tensor output, const torch::Tensor& input) {
    std::string mine;
    append_bytes(mine, input);
    std::vector<std::string> all = exchange_same_sizes(what, mine);
    auto chunks = output.view({world_.world_size, -1});
    for (int r = 0; r < world_.world_size; ++r) chunks[r].copy_(tensor_over(all[r], 0, chunks[r]));
  }

  void run_broadcast(const std::string& what, const std::vector<torch::Tensor>& tensors, int root) {
    bool is_root = world_.rank == root;
    std::string mine;
    if (is_root)
      for (const auto& t : tensors) append_bytes(mine, t);
    std::vector<std::string> got = exchange_->round(what, is_root, mine, {root});
    if (is_root) return;
    size_t expected = 0;
    for (const auto& t : tensors) expected += byte_size(t);
    if (got[0].size() != expected) {
      throw Error(what + ": rank " + std::to_string(root) + " sent " + std::to_string(got[0].size()) + " bytes but rank " +
                  std::to_string(world_.rank) + " expected " + std::to_string(expected) +
                  ": the ranks passed tensors of different sizes or dtypes");
    }
    size_t offset = 0;
    for (const auto& t : tensors) {
      t.copy_(tensor_over(got[0], offset, t));
      offset += byte_size(t);
    }
  }

  void finish(bool wait_for_others) {
    if (finished_) return;
    finished_ = true;
    // Queued behind every pending collective, so leaving happens after they complete.
    auto left = submit(
        "leaving the process group",
        [this, wait_for_others](const std::string&) {
          heartbeat_->leave();  // leaving on purpose: the others must not take the silence for a death
          exchange_->leave(wait_for_others && failure_.empty());
        },
        /*collective=*/false);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    worker_.join();
    left->wait();
  }

  WorldInfo world_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::unique_ptr<Heartbeat> heartbeat_;      // this rank's signs of life, and the check on the others'
  std::unique_ptr<StoreExchange> exchange_;  // used by the worker thread only (after the rendezvous)
  bool finished_ = false;

  std::mutex mutex_;
  int64_t issued_ = 0;     // collectives issued so far; guarded by mutex_
  std::condition_variable wake_;
  std::deque<Job> queue_;  // guarded by mutex_
  bool stopping_ = false;  // guarded by mutex_
  std::string failure_;    // the first failure (worker thread only)
  std::thread worker_;
};

}  // namespace

std::shared_ptr<Communicator> make_cpu_communicator(const WorldInfo& world, const ProcessGroupConfig& config) {
  return std::make_shared<CpuCommunicator>(world, config);
}

}  // namespace amplab::dist::detail
