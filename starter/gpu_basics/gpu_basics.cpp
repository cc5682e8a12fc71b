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
  // TODO(gpu_basics-5): Allocate the destination once (torch::empty_like(source,
  // source.options().device(destination))), then time dst.copy_(src) with time_on_device on the
  // device that does the work (the GPU if either side is one). Bytes moved: source.nbytes(),
  // twice that when both sides are the same device. GB/s = bytes / (median ms * 1e6).
  AMPLAB_TODO("gpu_basics-5");
  return gbs;
}

int64_t matmul_flops(int64_t m, int64_t n, int64_t k) {
  // TODO(gpu_basics-6): Each of the m*n outputs is a dot product of length k: k multiplies and
  // k adds. Then implement matmul_tflops() below.
  AMPLAB_TODO("gpu_basics-6");
}

double matmul_tflops(int64_t n, torch::ScalarType dtype, torch::Device device, bool allow_tf32, int warmup, int repeats) {
  double tflops = 0;
  // TODO(gpu_basics-6): Make two random n x n matrices of `dtype` on `device`, hold an
  // amplab::Tf32Guard(allow_tf32) while timing torch::mm with time_on_device, and turn the
  // median into TFLOP/s: matmul_flops(n, n, n) / (median ms * 1e9).
  AMPLAB_TODO("gpu_basics-6");
  return tflops;
}

}  // namespace gpu_basics
