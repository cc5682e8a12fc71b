// How the lab checks and times your kernels (kernel_bench.hpp).
#include "kernel_bench.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <iomanip>
#include <sstream>

namespace cuda_kernels {

double cpu_ms(const BenchConfig& bench, int64_t elements, const std::function<void()>& work) {
  if (elements > bench.cpu_max_elements) return NAN;
  work();
  return amplab::quantile(amplab::time_back_to_back(work, torch::kCPU, 1, std::min(bench.repeats, 3)), 0.5);
}

std::optional<Cost> cost(const std::function<Cost()>& of) {
  try {
    return of();
  } catch (const amplab::NotImplemented&) {
    return std::nullopt;
  }
}

std::string error_check(const torch::Tensor& got, const torch::Tensor& want, double tolerance) {
  const double scale = want.abs().max().item<double>() + 1e-30;
  const double err = (got.to(torch::kFloat64) - want.to(torch::kFloat64)).abs().max().item<double>() / scale;
  std::ostringstream s;
  s << std::setprecision(2) << err;
  return (err <= tolerance ? "ok (" : "WRONG (") + s.str() + " of max)";
}

}  // namespace cuda_kernels
