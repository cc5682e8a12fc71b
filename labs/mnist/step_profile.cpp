// Where a training step's time goes, phase by phase (step_profile.hpp).
#include "step_profile.hpp"

#include <chrono>
#include <functional>
#include <map>

#include "amplab/infra/device.hpp"
#include "amplab/measure/timing.hpp"
#include "amplab/train/precision.hpp"
#include "amplab/train/step.hpp"

namespace mnist {

using amplab::AutocastGuard;
using amplab::Batch;
using amplab::BatchSource;
using amplab::DeviceTimer;
using amplab::Trainer;
using amplab::summarize;
using amplab::synchronize;
using amplab::time_back_to_back;

std::vector<PhaseTiming> profile_step(Trainer& trainer, BatchSource& batches, int steps) {
  const torch::Device device = trainer.device();
  std::map<std::string, std::vector<double>> host, dev;
  const std::vector<std::string> order = {"data", "forward", "backward", "optimizer"};
  auto timed = [&](const std::string& phase, const std::function<void()>& work) {
    synchronize(device);
    DeviceTimer timer(device);
    const auto start = std::chrono::steady_clock::now();
    timer.start();
    work();
    host[phase].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    dev[phase].push_back(timer.stop_ms());
  };
  const int64_t n = batches.batches_per_epoch();
  for (int i = 0; i < steps + 3; ++i) {  // 3 untimed
    trainer.optimizer().zero_grad();
    Batch batch;
    torch::Tensor loss;
    timed("data", [&] { batch = batches.batch(i % n); });
    timed("forward", [&] {
      AutocastGuard autocast(device, trainer.precision());
      loss = trainer.forward_loss(batch);
    });
    // The loss as it comes: a GradScaler's multiply is one tiny kernel more, and the profile's
    // steps feed nothing that is reported.
    timed("backward", [&] { loss.backward(); });
    timed("optimizer", [&] { amp_training::optimizer_step(trainer); });  // lab 2's
    if (i < 3)
      for (const auto& phase : order) host[phase].clear(), dev[phase].clear();
  }
  std::vector<PhaseTiming> rows;
  PhaseTiming sum{"sum of the phases"};
  for (const auto& phase : order) {
    rows.push_back({phase, summarize(host[phase]).median, summarize(dev[phase]).median});
    sum.host_ms += rows.back().host_ms;
    sum.device_ms += rows.back().device_ms;
  }
  rows.push_back(sum);
  // The same steps queued back to back, as the eager loop runs them.
  int64_t next = 0;
  auto ms = time_back_to_back([&] { trainer.step(batches.batch(next++ % n)); }, device, steps,
                                      device.is_cuda() ? 3 : 1);
  const double eager = summarize(ms).median;
  rows.push_back({"eager step, back to back", eager, eager});
  return rows;
}

}  // namespace mnist
