// Per-rank timelines of data-parallel steps (timeline.hpp): the Chrome trace of all ranks, the all-reduce watcher, trace_steps.
#include "timeline.hpp"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <set>

#include "amplab/infra/device.hpp"
#include "amplab/infra/files.hpp"
#include "amplab/report/table.hpp"

namespace ddp_lab {

using amplab::dist::Communicator;
using amplab::dist::Work;
using amplab::fixed;
using amplab::synchronize;
using amplab::write_file_atomic;

void Timeline::span(const std::string& name, const std::string& track, int64_t start_us, int64_t end_us) {
  if (!recording_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back({{"name", name}, {"ph", "X"}, {"ts", start_us}, {"dur", std::max<int64_t>(end_us - start_us, 1)},
                     {"tid", track}});
}

void Timeline::instant(const std::string& name, const std::string& track, int64_t at_us) {
  if (!recording_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back({{"name", name}, {"ph", "i"}, {"s", "t"}, {"ts", at_us}, {"tid", track}});
}

void Timeline::write_all_ranks(Communicator& comm, const std::string& path) {
  nlohmann::json mine;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    mine = events_;
    events_.clear();
  }
  auto all = comm.all_gather_bytes(mine.dump());
  if (path.empty()) return;
  nlohmann::json trace = nlohmann::json::array();
  for (size_t r = 0; r < all.size(); ++r) {
    trace.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", r}, {"args", {{"name", "rank " + std::to_string(r)}}}});
    for (auto event : nlohmann::json::parse(all[r])) {
      event["pid"] = r;
      trace.push_back(std::move(event));
    }
  }
  write_file_atomic(path, nlohmann::json{{"traceEvents", trace}, {"displayTimeUnit", "ms"}}.dump());
}

namespace {

// "all-reduce 0.016 MB (2 tensors)": an all-reduce's name on the timeline.
std::string describe(const std::vector<torch::Tensor>& tensors) {
  int64_t bytes = 0;
  for (const auto& t : tensors) bytes += t.numel() * t.element_size();
  return "all-reduce " + fixed(static_cast<double>(bytes) / 1e6, 3) + " MB (" + std::to_string(tensors.size()) +
         " tensor" + (tensors.size() == 1 ? "" : "s") + ")";
}

}  // namespace

TimelineCommunicator::TimelineCommunicator(std::shared_ptr<Communicator> inner, Timeline& timeline)
    : inner_(std::move(inner)), timeline_(timeline), watcher_([this] { watch(); }) {}

TimelineCommunicator::~TimelineCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  watcher_.join();
}

std::shared_ptr<Work> TimelineCommunicator::all_reduce_sum(std::vector<torch::Tensor> tensors) {
  auto label = describe(tensors);
  return watched(label, inner_->all_reduce_sum(std::move(tensors)));
}

std::shared_ptr<Work> TimelineCommunicator::all_reduce_mean(std::vector<torch::Tensor> tensors) {
  auto label = describe(tensors);
  return watched(label, inner_->all_reduce_mean(std::move(tensors)));
}

void TimelineCommunicator::flush() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

std::shared_ptr<Work> TimelineCommunicator::watched(const std::string& label, std::shared_ptr<Work> work) {
  if (!timeline_.recording()) return work;
  const int64_t now = Timeline::now_us();
  if (inner_->device().is_cuda()) {
    timeline_.instant(label + " launched", "all-reduces", now);
    return work;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back({label, now, work});
  }
  wake_.notify_one();
  return work;
}

void TimelineCommunicator::watch() {
  for (;;) {
    Pending next;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      next = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    try {
      next.work->wait();
    } catch (...) {  // the caller's own wait() reports it
    }
    timeline_.span(next.label, "all-reduces", next.launched_us, Timeline::now_us());
    {
      std::lock_guard<std::mutex> lock(mutex_);
      busy_ = false;
    }
    idle_.notify_all();
  }
}

void trace_steps(const std::function<void()>& step, torch::Device device, const std::string& path, bool back_to_back) {
  using torch::profiler::impl::ActivityType;
  torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  std::set<ActivityType> activities{ActivityType::CPU};
  if (device.is_cuda()) activities.insert(ActivityType::CUDA);
  if (!path.empty()) {
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
  }
  for (int i = 0; i < (back_to_back ? 3 : 2); ++i) {
    RECORD_USER_SCOPE("amplab_step");  // the steps' bounds in the trace
    step();
    if (!back_to_back) synchronize(device);
  }
  synchronize(device);
  if (!path.empty()) torch::autograd::profiler::disableProfiler()->save(path);
}

}  // namespace ddp_lab
