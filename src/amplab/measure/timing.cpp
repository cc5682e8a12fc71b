// Timing on a GPU (timing.hpp): CUDA-event marks, back-to-back repeats, quantile summaries.
#include "amplab/measure/timing.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#ifdef AMPLAB_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "amplab/infra/device.hpp"
#include "amplab/infra/error.hpp"

namespace amplab {

double quantile(std::vector<double> samples, double q) {
  if (samples.empty()) throw Error("quantile of no samples");
  std::sort(samples.begin(), samples.end());
  double position = q * static_cast<double>(samples.size() - 1);
  auto lower = static_cast<size_t>(std::floor(position));
  size_t upper = std::min(lower + 1, samples.size() - 1);
  double fraction = position - static_cast<double>(lower);
  return samples[lower] + (samples[upper] - samples[lower]) * fraction;
}

Summary summarize(std::vector<double> samples) {
  Summary s;
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  s.count = samples.size();
  s.median = quantile(samples, 0.5);
  s.q1 = quantile(samples, 0.25);
  s.q3 = quantile(samples, 0.75);
  s.iqr = s.q3 - s.q1;
  s.mean = std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(samples.size());
  s.min = samples.front();
  s.max = samples.back();
  return s;
}

struct DeviceMarks::Events {
#ifdef AMPLAB_WITH_CUDA
  std::vector<at::cuda::CUDAEvent> marks;
#endif
};

DeviceMarks::DeviceMarks(torch::Device device, size_t count) : device_(device), host_ms_(count, 0.0) {
  if (count < 2) throw Error("DeviceMarks needs at least two marks");
  events_ = std::make_unique<Events>();
#ifdef AMPLAB_WITH_CUDA
  if (device_.is_cuda())
    for (size_t i = 0; i < count; ++i) events_->marks.emplace_back(cudaEventDefault);
#endif
}
DeviceMarks::~DeviceMarks() = default;

void DeviceMarks::mark(size_t index) {
  if (index >= host_ms_.size()) throw Error("DeviceMarks::mark: no mark " + std::to_string(index));
#ifdef AMPLAB_WITH_CUDA
  if (device_.is_cuda()) {
    events_->marks[index].record(c10::cuda::getCurrentCUDAStream(device_.index()));
    return;
  }
#endif
  host_ms_[index] = host_.milliseconds();
}

std::vector<double> DeviceMarks::intervals_ms() {
  std::vector<double> intervals;
#ifdef AMPLAB_WITH_CUDA
  if (device_.is_cuda()) {
    events_->marks.back().synchronize();
    for (size_t i = 0; i + 1 < events_->marks.size(); ++i)
      intervals.push_back(events_->marks[i].elapsed_time(events_->marks[i + 1]));
    return intervals;
  }
#endif
  for (size_t i = 0; i + 1 < host_ms_.size(); ++i) intervals.push_back(host_ms_[i + 1] - host_ms_[i]);
  return intervals;
}

std::vector<double> time_back_to_back(const std::function<void()>& work, torch::Device device, int repeats,
                                      int windows) {
  if (repeats < 1) throw Error("time_back_to_back: repeats must be at least 1");
  std::vector<double> per_run;
  DeviceTimer timer(device);
  for (int w = 0; w < windows; ++w) {
    timer.start();
    for (int i = 0; i < repeats; ++i) work();
    per_run.push_back(timer.stop_ms() / repeats);
  }
  return per_run;
}


}  // namespace amplab
