// Your copy of this lab's code: fill in every TODO(...) below; the tests tell you which one
// fails. (Instructors: generated from solution/ by scripts/make-starter.py; edit the solution.)
// Lab 1, GPU basics. Each TODO below is one exercise; see labs/gpu_basics/README.md.
#include "gpu_basics.hpp"

#include <ATen/Parallel.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>

#include "amplab/infra/device.hpp"
#include "amplab/infra/env.hpp"
#include "amplab/infra/error.hpp"
#include "amplab/train/precision.hpp"

namespace gpu_basics {

DeviceReport describe_device(torch::Device device) {
  DeviceReport report;
  report.device = device.str();
  report.cpu_threads = at::get_num_threads();
  // TODO(gpu_basics-1): Fill in the report. On a GPU, at::cuda::getDeviceProperties(index) has
  // name, multiProcessorCount, totalGlobalMem (bytes) and major/minor (the compute capability);
  // at::detail::getCUDAHooks().versionCUDART() and .versionCuDNN() give 13000 -> "13.0" and
  // 91900 -> "9.19.0". On the CPU, name is amplab::cpu_model_name() and the GPU fields stay empty.
  AMPLAB_TODO("gpu_basics-1");
  return report;
}

void move_to_device(torch::nn::Module& model, torch::Device device) {
  // TODO(gpu_basics-2): Move every parameter and buffer of `model` to `device` (one call on the
  // module does it). Then implement tensors_not_on() below.
  AMPLAB_TODO("gpu_basics-2");
}

std::vector<std::string> tensors_not_on(const torch::nn::Module& model, torch::Device device) {
  std::vector<std::string> names;
  // TODO(gpu_basics-2): Collect the names of parameters, then buffers (named_parameters() and
  // named_buffers(), recursively) whose tensor is not on `device`. "cuda" without an index
  // accepts any GPU; "cuda:1" only that one.
  AMPLAB_TODO("gpu_basics-2");
  return names;
}

std::string explain_device_mismatch(const torch::Tensor& a, const torch::Tensor& b) {
  // TODO(gpu_basics-3): Compute a + b inside try/catch. torch reports the problem as a c10::Error
  // ("Expected all tensors to be on the same device..."). Return "" when it works; otherwise a
  // sentence naming a.device() and b.device() and the fix (move one with .to(device)).
  AMPLAB_TODO("gpu_basics-3");
}

amplab::Summary time_on_device(const std::function<void()>& work, torch::Device device, int warmup, int repeats) {
  std::vector<double> milliseconds;
  // TODO(gpu_basics-4): Run `work` warmup times, then wait for the device (amplab::synchronize).
  // Then time each of `repeats` runs by itself: on a GPU record an at::cuda::CUDAEvent (created
  // with cudaEventDefault so that it can time) before and after on the current stream, wait for
  // the second and read elapsed_time(); on the CPU use amplab::Stopwatch. Push each duration (ms)
  // into `milliseconds`.
  AMPLAB_TODO("gpu_basics-4");
  return amplab::summarize(milliseconds);
}

amplab::Summary time_naively(const std::function<void()>& work, int repeats) {
  std::vector<double> milliseconds;
  for (int i = 0; i < repeats; ++i) {
    amplab::Stopwatch clock;
    work();  // on a GPU this only queues kernels: the clock stops before they run
    milliseconds.push_back(clock.milliseconds());
  }
  return amplab::summarize(milliseconds);
}

double copy_bandwidth_gbs(const torch::Tensor& source, torch::Device destination, int warmup, int repeats) {
  double gbs = 0;
  // TODO(gpu_basics-5): The bandwidth of copying `source` to `destination`, in GB/s (10^9 bytes
  // per second) over the median of time_on_device's repeats. Time only the copy: the destination
  // is allocated once, before the timing, shaped and typed like the source. Time it on the device
  // that does the work (a GPU when either side is one: the copy engines, not the host).
  // Pitfalls: count the bytes the memory actually moves: a copy within one device reads every
  // byte and writes it again, a copy between two devices reads on one side and writes on the
  // other. And mind the units: time_on_device gives milliseconds.
  AMPLAB_TODO("gpu_basics-5");
  return gbs;
}

int64_t matmul_flops(int64_t m, int64_t n, int64_t k) {
  // TODO(gpu_basics-6): The FLOPs of an (m x k) by (k x n) matrix product, counted as the
  // roofline counts them (a multiply and an add are two). Then implement matmul_tflops() below.
  AMPLAB_TODO("gpu_basics-6");
}

double matmul_tflops(int64_t n, torch::ScalarType dtype, torch::Device device, bool allow_tf32, int warmup, int repeats) {
  double tflops = 0;
  // TODO(gpu_basics-6): The throughput of torch::mm on two random n x n matrices of `dtype` on
  // `device`, in TFLOP/s (10^12 FLOP per second) over the median of time_on_device's repeats.
  // TF32 is a global switch of cuBLAS: allow it exactly while this matmul is timed, and restore
  // it after (amplab::Tf32Guard, `precision.hpp`). Pitfalls: make the inputs before the timing (an
  // allocation and a random fill are work too); milliseconds in, TFLOP/s out.
  AMPLAB_TODO("gpu_basics-6");
  return tflops;
}

}  // namespace gpu_basics
