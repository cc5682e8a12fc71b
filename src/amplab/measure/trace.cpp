// Profiler traces of a few training steps or of a lab's phases, and the phases' NVTX ranges
// (trace.hpp), through PyTorch's Kineto profiler.
#include "amplab/measure/trace.hpp"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <set>
#include <sstream>
#include <system_error>
#include <thread>

#include "amplab/infra/device.hpp"
#include "amplab/infra/error.hpp"
#include "amplab/infra/log.hpp"

#ifdef AMPLAB_WITH_CUDA
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <nvtx3/nvToolsExt.h>
#endif

namespace amplab {
namespace {

// The phase trace a safe point may cut, with the thread that runs it (null when none is open).
std::atomic<PhaseTrace*> open_phase_trace{nullptr};
std::thread::id open_phase_thread;

// Starts Kineto on the host (and the GPU's stream when `device` is one), with nothing of earlier
// work in flight.
void start_profiler(torch::Device device) {
  using torch::profiler::impl::ActivityType;
  torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  std::set<ActivityType> activities{ActivityType::CPU};
  if (device.is_cuda()) activities.insert(ActivityType::CUDA);
  synchronize(device);
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
}

// Stops Kineto once the last kernels ended and writes what it recorded to `path`.
void save_profile(torch::Device device, const std::string& path) {
  synchronize(device);
  auto result = torch::autograd::profiler::disableProfiler();
  result->save(path);
}

}  // namespace

struct StepTrace::StepRange {
  at::RecordFunction range{at::RecordScope::USER_SCOPE};
};

StepTrace::StepTrace(std::string path, int64_t first_step, int64_t steps, torch::Device device)
    : path_(std::move(path)), first_step_(first_step), steps_(steps), device_(device) {}

StepTrace::~StepTrace() {
  try {
    if (running_) finish();
  } catch (const std::exception& e) {
    log::warn(std::string("run.trace: the trace could not be saved: ") + e.what());
  }
}

void StepTrace::start() {
  if (open_phase_trace.load(std::memory_order_relaxed) != nullptr) {
    log::warn("train.trace_steps: run.trace is recording this phase; the steps are in its trace, not in " + path_);
    saved_ = true;  // nothing more to do for this window
    return;
  }
  start_profiler(device_);
  running_ = true;
}

void StepTrace::finish() {
  range_.reset();
  running_ = false;
  save_profile(device_, path_);
  saved_ = true;
  log::info("run.trace: " + std::to_string(steps_) + " step(s) traced into " + path_ +
            " (open it in https://ui.perfetto.dev or chrome://tracing)");
}

void StepTrace::before_step(int64_t step) {
  if (path_.empty() || saved_) return;
  if (step == first_step_ && !running_) start();
  if (!running_) return;
  range_ = std::make_unique<StepRange>();
  range_->range.before("amplab_step");
}

void StepTrace::after_step(int64_t step) {
  if (!running_) return;
  range_.reset();
  if (step + 1 >= first_step_ + steps_) finish();
}

struct PhaseTrace::PhaseRange {
  at::RecordFunction range{at::RecordScope::USER_SCOPE};
};

namespace {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string seconds_text(double seconds) {
  std::ostringstream out;
  out << seconds;
  return out.str();
}

// A CUDA graph being captured on this thread's stream: no synchronize, no profiler switch now.
bool capturing_a_graph(torch::Device device) {
#ifdef AMPLAB_WITH_CUDA
  if (device.is_cuda()) return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
#endif
  (void)device;
  return false;
}
}  // namespace

void trace_safe_point() {
  PhaseTrace* trace = open_phase_trace.load(std::memory_order_relaxed);
  if (trace && std::this_thread::get_id() == open_phase_thread) trace->at_safe_point();
}

PhaseTrace::PhaseTrace(PathOf path_of, torch::Device device, Limits limits)
    : path_of_(std::move(path_of)), device_(device), limits_(std::move(limits)) {}

PhaseTrace::~PhaseTrace() {
  try {
    finish();
  } catch (const std::exception& e) {
    log::warn(std::string("run.trace: the phase's trace could not be saved: ") + e.what());
  }
}

bool PhaseTrace::wanted(const std::string& name) const {
  if (limits_.filters.empty()) return true;
  for (const auto& filter : limits_.filters)
    if (name.find(filter) != std::string::npos) return true;
  return false;
}

void PhaseTrace::phase(const std::string& name) {
  finish();
  if (name.empty() || !wanted(name)) return;
  if (bytes_written_ >= limits_.budget_bytes) {
    if (!over_budget_logged_)
      log::info("run.trace: the traces reached run.trace_budget_mb (" + std::to_string(bytes_written_ >> 20) +
                " MiB written); phase '" + name + "' and those after it are not traced");
    over_budget_logged_ = true;
    return;
  }
  start(name);
}

void PhaseTrace::start(const std::string& name) {
  const std::string path = path_of_(name, ++seen_[name]);
  start_profiler(device_);
  open_name_ = name;
  open_path_ = path;
  range_ = std::make_unique<PhaseRange>();
  range_->range.before(name);
  started_at_ = steady_seconds();
  open_phase_thread = std::this_thread::get_id();
  open_phase_trace.store(this);
}

void PhaseTrace::finish() { save(/*cut=*/false); }

void PhaseTrace::at_safe_point() {
  if (open_path_.empty() || steady_seconds() - started_at_ < limits_.seconds || capturing_a_graph(device_)) return;
  save(/*cut=*/true);
}

void PhaseTrace::save(bool cut) {
  if (open_path_.empty()) return;
  open_phase_trace.store(nullptr);
  range_.reset();
  const std::string path = std::move(open_path_), name = std::move(open_name_);
  open_path_.clear();
  open_name_.clear();
  save_profile(device_, path);
  std::error_code error;
  const auto bytes = std::filesystem::file_size(path, error);
  if (!error) bytes_written_ += static_cast<int64_t>(bytes);
  written_.push_back(path);
  const std::string size = " (" + std::to_string(error ? 0 : bytes >> 10) + " KiB)";
  if (cut)
    log::info("run.trace: phase '" + name + "' traced for its first " + seconds_text(limits_.seconds) + " s into " + path + size +
              "; the rest of it runs untraced (run.trace_seconds)");
  else
    log::info("run.trace: phase '" + name + "' traced into " + path + size);
}

NvtxPhases::~NvtxPhases() { phase(""); }

void NvtxPhases::phase(const std::string& name) {
#ifdef AMPLAB_WITH_CUDA
  if (open_) nvtxRangePop();
  open_ = !name.empty();
  if (open_) nvtxRangePushA(name.c_str());
#else
  (void)name;
#endif
}

}  // namespace amplab
