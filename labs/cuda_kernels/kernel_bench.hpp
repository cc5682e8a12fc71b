// How the lab checks and times your kernels, given (no TODOs): a kernel's check and median time
// (or the TODO still in its way), PyTorch's CPU op on the same sizes, the cost model's figures
// when TODO 1 is filled, and the roofline's points and bandwidth bars for scripts/plot.py.
#pragma once

#include <torch/types.h>

#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "amplab/infra/error.hpp"
#include "amplab/measure/timing.hpp"
#include "amplab/report/results.hpp"
#include "config.hpp"
#include "cuda_kernels.hpp"

namespace cuda_kernels {

using nlohmann::json;

// A kernel's check and time, or the TODO still in its way; then ms is NaN, and so is every
// figure made from it (a "-" in the tables).
struct Outcome {
  double ms = NAN;
  std::string todo;   // "cuda_kernels-4" while that hole is empty
  std::string check;  // "ok", "exact", or what is wrong
  json time() const { return todo.empty() ? json(ms) : json("TODO(" + todo + ")"); }
  json checked() const { return todo.empty() ? json(check) : json(); }
};

struct Timer {
  const BenchConfig& bench;
  torch::Device device;
  // Median milliseconds per call: `warmup` calls, then `repeats` windows of `window` calls back to back.
  double ms(const std::function<void()>& work) const {
    for (int i = 0; i < bench.warmup; ++i) work();
    return amplab::quantile(amplab::time_back_to_back(work, device, bench.window, bench.repeats), 0.5);
  }
  // Runs `check` (returns the check column) then times `work`; an empty hole becomes the outcome.
  Outcome kernel(const std::function<std::string()>& check, const std::function<void()>& work) const {
    Outcome out;
    try {
      out.check = check();
      out.ms = ms(work);
    } catch (const amplab::NotImplemented& e) {
      out.todo = e.todo_id();
    }
    return out;
  }
};

// Median milliseconds of PyTorch's CPU op: one warm-up call, then up to 3 calls; NaN (a "-") when the
// tensor is larger than bench.cpu_max_elements.
double cpu_ms(const BenchConfig& bench, int64_t elements, const std::function<void()>& work);

// The cost model is TODO 1: until it is filled, no GB/s, TFLOP/s or roofline from it.
std::optional<Cost> cost(const std::function<Cost()>& of);
inline const char* const kNoCostModel = "(GB/s of your kernels need your cost model: TODO(cuda_kernels-1))\n";

// "ok (1.2e-07 of max)" or "WRONG (...)": the largest error relative to the largest value.
std::string error_check(const torch::Tensor& got, const torch::Tensor& want, double tolerance);

// roofline.csv's points, bandwidth.csv's bars (scripts/plot.py kernels) and the roofs they stand under.
struct Plots {
  amplab::Results& results;
  double copy_gbs = 0;
  double fp32_peak = 0, bf16_peak = 0;  // TFLOP/s of cuBLAS, the best size

  void point(const std::string& part, const std::string& kernel, const std::optional<Cost>& c, double ms) {
    if (c && std::isfinite(ms) && c->bytes > 0)
      results.table("roofline", {{"part", ""}, {"kernel", ""}, {"intensity", ""}, {"tflops", ""}})
          .add({part, kernel, c->intensity(), c->flops / (ms * 1e9)});
  }
  void gbs(const std::string& part, const std::string& kernel, double value, bool ours) {
    if (std::isfinite(value))
      results.table("bandwidth", {{"part", ""}, {"kernel", ""}, {"gbs", ""}, {"ours", ""}}).add({part, kernel, value, ours});
  }
  json roofs() const {
    json roofs = {{"memory_gbs", copy_gbs}};
    if (fp32_peak > 0) roofs["fp32_tflops"] = fp32_peak;
    if (bf16_peak > 0) roofs["bf16_tflops"] = bf16_peak;
    return roofs;
  }
};

}  // namespace cuda_kernels
