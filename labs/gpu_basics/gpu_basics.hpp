// Lab 1, GPU basics: the functions you implement (starter/gpu_basics/gpu_basics.cpp).
// The lab binary (apps/gpu_basics) calls them; tests/labs/gpu_basics_test.cpp grades them.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "amplab/infra/error.hpp"  // AMPLAB_TODO in the starter
#include "amplab/measure/timing.hpp"

namespace gpu_basics {

// What the lab reports about the device it runs on.
struct DeviceReport {
  std::string device;               // "cuda:0" or "cpu"
  std::string name;                 // GPU name, or the CPU model
  int multiprocessors = 0;          // streaming multiprocessors (SMs); 0 on the CPU
  double memory_gib = 0;            // total device memory; 0 on the CPU
  std::string compute_capability;   // "9.0" for Hopper; "" on the CPU
  std::string cuda_runtime;         // "13.0", "" without CUDA
  std::string cudnn;                // "9.19.0", "" without a GPU
  int cpu_threads = 0;              // torch's intra-op threads (at::get_num_threads)
};

// TODO(gpu_basics-1)
DeviceReport describe_device(torch::Device device);

// TODO(gpu_basics-2)
void move_to_device(torch::nn::Module& model, torch::Device device);
// Names ("fc1.weight", "norm.running_mean") of parameters and buffers not on `device`, in the
// order named_parameters() then named_buffers() list them.
std::vector<std::string> tensors_not_on(const torch::nn::Module& model, torch::Device device);

// TODO(gpu_basics-3)
// Adds `a` and `b`. If torch refuses because they live on different devices, returns a short
// explanation naming both devices and the fix; returns "" when the addition works.
std::string explain_device_mismatch(const torch::Tensor& a, const torch::Tensor& b);

// TODO(gpu_basics-4)
// Times `work` correctly on `device`: `warmup` untimed runs, then `repeats` timed runs, each
// timed by itself (CUDA events on a GPU; synchronize + host clock on the CPU). Milliseconds.
amplab::Summary time_on_device(const std::function<void()>& work, torch::Device device, int warmup, int repeats);

// Given, not a TODO: the wrong way (host clock around asynchronous launches, no synchronize).
amplab::Summary time_naively(const std::function<void()>& work, int repeats);

// TODO(gpu_basics-5)
// Bandwidth of copying `source` to `destination` (GB/s = 1e9 bytes/s), median of `repeats`.
// A copy within one device reads and writes every byte, so it moves 2x the tensor's bytes;
// a copy between host and device moves the bytes once.
double copy_bandwidth_gbs(const torch::Tensor& source, torch::Device destination, int warmup, int repeats);

// TODO(gpu_basics-6)
// Floating-point operations of an (m x k) @ (k x n) matmul: one multiply and one add per term.
int64_t matmul_flops(int64_t m, int64_t n, int64_t k);
// Throughput of an n x n x n matmul in `dtype` on `device` (TFLOP/s, median of `repeats`).
// `allow_tf32` lets float32 matmuls use TF32 tensor cores (a GPU setting).
double matmul_tflops(int64_t n, torch::ScalarType dtype, torch::Device device, bool allow_tf32, int warmup, int repeats);

}  // namespace gpu_basics
