// A profiler trace of a few training steps (trace.hpp), through PyTorch's Kineto profiler.
#include "amplab/measure/trace.hpp"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <set>

#include "amplab/infra/device.hpp"
#include "amplab/infra/error.hpp"
#include "amplab/infra/log.hpp"

namespace amplab {

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
  using torch::profiler::impl::ActivityType;
  torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  std::set<ActivityType> activities{ActivityType::CPU};
  if (device_.is_cuda()) activities.insert(ActivityType::CUDA);
  synchronize(device_);  // the window starts with nothing of earlier steps in flight
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
  running_ = true;
}

void StepTrace::finish() {
  range_.reset();
  synchronize(device_);  // the last step's kernels are in the trace
  auto result = torch::autograd::profiler::disableProfiler();
  running_ = false;
  result->save(path_);
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

}  // namespace amplab
