// PhaseMarks (phase_marks.hpp): a step's forward, backward and after backward, on the device and on a timeline.
#include "phase_marks.hpp"

#include <algorithm>

namespace ddp_lab {

using amplab::GradientSync;
using amplab::DeviceMarks;
using amplab::summarize;

PhaseMarks::PhaseMarks(GradientSync* inner, torch::Device device, size_t capacity, Timeline* timeline)
    : inner_(inner), timeline_(timeline) {
  for (size_t i = 0; i < capacity; ++i) steps_.push_back(std::make_unique<DeviceMarks>(device, 4));
}

void PhaseMarks::start_step() {
  current_ = steps_[started_++ % steps_.size()].get();
  current_->mark(0);
  host_mark(0);
}

void PhaseMarks::end_step() {
  current_->mark(3);
  host_mark(3);
  if (timeline_ && timeline_->recording()) {
    const char* names[] = {"forward", "backward", "after backward (sync, optimizer)"};
    for (int k = 0; k < 3; ++k) timeline_->span(names[k], "compute", host_us_[k], host_us_[k + 1]);
  }
}

std::vector<double> PhaseMarks::medians() {
  std::vector<std::vector<double>> phases(3);
  for (size_t i = 0; i < std::min(started_, steps_.size()); ++i) {
    auto ms = steps_[i]->intervals_ms();
    for (size_t k = 0; k < 3; ++k) phases[k].push_back(ms[k]);
  }
  return {summarize(phases[0]).median, summarize(phases[1]).median, summarize(phases[2]).median};
}

void PhaseMarks::before_forward() {
  if (inner_) inner_->before_forward();
}

void PhaseMarks::before_backward(const torch::Tensor& loss, bool reduce_after_this) {
  current_->mark(1);
  host_mark(1);
  if (inner_) inner_->before_backward(loss, reduce_after_this);
}

void PhaseMarks::finish() {
  current_->mark(2);
  host_mark(2);
  if (inner_) inner_->finish();
}

bool PhaseMarks::can_step_each_bucket(const std::vector<torch::Tensor>& params) {
  return inner_ && inner_->can_step_each_bucket(params);
}

void PhaseMarks::finish_stepping_each_bucket(
    const std::function<void(const std::vector<torch::Tensor>&)>& step_bucket) {
  current_->mark(2);
  host_mark(2);
  inner_->finish_stepping_each_bucket(step_bucket);
}

}  // namespace ddp_lab
