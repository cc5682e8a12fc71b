// PhaseMarks: a gradient sync's wrapper that splits each step into forward, backward and after backward (device marks, a timeline).
//
// With DDP, the all-reduces that run beside backward show up as a longer backward (they share
// the GPU with its matmuls), and those still running when backward ends as a longer tail (with
// the optimizer step, which is the whole tail alone). Wraps the DDP sync, or nothing alone:
//
//   PhaseMarks phases(sync, device, steps, &timeline);
//   trainer.set_gradient_sync(&phases);
//   phases.start_step(); trainer.step(batch); phases.end_step();
#pragma once

#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "amplab/measure/timing.hpp"
#include "amplab/train/trainer.hpp"
#include "timeline.hpp"

namespace ddp_lab {

class PhaseMarks final : public amplab::GradientSync {
 public:
  // Keeps the marks of the last `capacity` steps, reusing their events (no events made in the
  // timed loop); with a timeline, puts each recorded step's phases on its "compute" track.
  PhaseMarks(amplab::GradientSync* inner, torch::Device device, size_t capacity, Timeline* timeline = nullptr);
  void start_step();
  void end_step();
  // Medians over the last `capacity` steps (fewer if fewer ran): forward, backward, after backward (ms).
  std::vector<double> medians();

  void before_forward() override;
  void before_backward(const torch::Tensor& loss, bool reduce_after_this) override;
  void finish() override;
  bool can_step_each_bucket(const std::vector<torch::Tensor>& params) override;
  void finish_stepping_each_bucket(const std::function<void(const std::vector<torch::Tensor>&)>& step_bucket) override;

 private:
  void host_mark(int k) { host_us_[k] = Timeline::now_us(); }  // on the CPU the host's clock is the compute's

  amplab::GradientSync* inner_;
  Timeline* timeline_;
  int64_t host_us_[4] = {0, 0, 0, 0};
  std::vector<std::unique_ptr<amplab::DeviceMarks>> steps_;
  amplab::DeviceMarks* current_ = nullptr;
  size_t started_ = 0;
};

}  // namespace ddp_lab
