// Where tensors live: parsing "auto|cpu|cuda|cuda:N" and checking that a model sits on one device.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <string>

namespace amplab {

// "auto" picks cuda:0 when a GPU is visible, else the CPU. Asking for CUDA where there is none,
// or for a GPU index that does not exist, is an amplab::Error that says what to do instead.
torch::Device resolve_device(const std::string& spec);

bool cuda_available();
int cuda_device_count();

// Throws amplab::Error naming the first parameter or buffer that is not on `device`.
void check_on_device(const torch::nn::Module& module, torch::Device device);

// "cuda:0 (NVIDIA H200, 139.8 GiB)" or "cpu (AMD EPYC ..., 16 threads)"
std::string describe(torch::Device device);

// Waits for all queued work on `device` (no-op on CPU).
void synchronize(torch::Device device);

}  // namespace amplab
