// Per-rank timelines of data-parallel steps: Timeline, TimelineCommunicator (all-reduces on it), trace_steps (a profiler trace).
//
// Timeline holds spans on the host's clock (microseconds of steady_clock, the same clock for every
// process of a machine), per rank and track, and writes every rank's in one Chrome trace
// (ui.perfetto.dev, chrome://tracing). TimelineCommunicator wraps a communicator and puts each
// all-reduce on a Timeline; PhaseMarks (phase_marks.hpp) puts each step's phases on it.
#pragma once

#include <torch/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "amplab/dist/communicator.hpp"

namespace ddp_lab {

// Spans and instants on the host's clock, recorded only while recording() is on (thread-safe).
class Timeline {
 public:
  using Clock = std::chrono::steady_clock;
  void set_recording(bool on) { recording_ = on; }
  bool recording() const { return recording_; }
  static int64_t now_us() {
    return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch()).count();
  }
  void span(const std::string& name, const std::string& track, int64_t start_us, int64_t end_us);
  void instant(const std::string& name, const std::string& track, int64_t at_us);
  // Every rank's events in one Chrome trace (a collective: every rank calls it); the rank whose
  // `path` is not empty writes it. The events recorded so far are cleared.
  void write_all_ranks(amplab::dist::Communicator& comm, const std::string& path);

 private:
  std::atomic<bool> recording_{false};
  std::mutex mutex_;
  nlohmann::json events_ = nlohmann::json::array();
};

// The communicator to hand a gradient sync when its all-reduces should be on a timeline: passes
// everything to the real one, and puts each all-reduce on the timeline, from its launch (by a
// gradient hook during backward, or after it) to its end. On the CPU backend collectives complete
// in the order they were issued, and a thread of this class waits for each to see when it ends;
// on GPUs the launch is what the host sees (the kernels are in the profiler's trace).
class TimelineCommunicator final : public amplab::dist::Communicator {
 public:
  TimelineCommunicator(std::shared_ptr<amplab::dist::Communicator> inner, Timeline& timeline);
  ~TimelineCommunicator() override;
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }
  torch::Device device() const override { return inner_->device(); }
  std::shared_ptr<amplab::dist::Work> all_reduce_sum(std::vector<torch::Tensor> tensors) override;
  std::shared_ptr<amplab::dist::Work> all_reduce_mean(std::vector<torch::Tensor> tensors) override;
  std::shared_ptr<amplab::dist::Work> then_copy(std::shared_ptr<amplab::dist::Work> work, std::vector<torch::Tensor> from,
                                  std::vector<torch::Tensor> to) override {
    return inner_->then_copy(std::move(work), std::move(from), std::move(to));
  }
  std::shared_ptr<amplab::dist::Work> reduce_scatter(torch::Tensor output, torch::Tensor input,
                                                     amplab::dist::Reduction op) override {
    return inner_->reduce_scatter(std::move(output), std::move(input), op);
  }
  std::shared_ptr<amplab::dist::Work> all_gather(torch::Tensor output, torch::Tensor input) override {
    return inner_->all_gather(std::move(output), std::move(input));
  }
  void broadcast(std::vector<torch::Tensor> tensors, int root) override { inner_->broadcast(std::move(tensors), root); }
  std::vector<std::string> all_gather_bytes(const std::string& mine) override { return inner_->all_gather_bytes(mine); }
  void barrier() override { inner_->barrier(); }
  // Returns once every all-reduce launched so far is on the timeline.
  void flush();

 private:
  struct Pending {
    std::string label;
    int64_t launched_us;
    std::shared_ptr<amplab::dist::Work> work;
  };
  std::shared_ptr<amplab::dist::Work> watched(const std::string& label, std::shared_ptr<amplab::dist::Work> work);
  void watch();

  std::shared_ptr<amplab::dist::Communicator> inner_;
  Timeline& timeline_;
  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<Pending> queue_;
  bool busy_ = false;  // the watcher is waiting for one
  bool stopping_ = false;
  std::thread watcher_;
};

// Runs `step` under PyTorch's profiler (kineto) on this rank and saves a Chrome trace: the
// kernels of each CUDA stream on one time line, so the all-reduces can be seen beside backward.
// Two steps, each waited for; or, back_to_back, three steps queued without waiting, as a
// training loop runs (bench/trace_steps.py finds each kernel's step by its launch). Every rank
// must call it (the steps hold collectives); ranks without a path only run the steps. Each step
// is an amplab_step range of the trace.
void trace_steps(const std::function<void()>& step, torch::Device device, const std::string& path, bool back_to_back);

}  // namespace ddp_lab
