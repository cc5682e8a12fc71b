// The ceilings a step's TFLOP/s are compared with: a timed bf16 matmul and the tensor cores' dense bf16 peak.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace amplab {

// Throughput of a bf16 n x n x n matmul in TFLOP/s: `warmup` untimed matmuls, then the median of
// `windows` windows of `repeats` matmuls queued back to back.
double bf16_matmul_tflops(int64_t n, torch::Device device, int warmup, int repeats, int windows);

// The tensor cores' dense bf16 peak at the GPU's highest SM clock: SMs x clock x FLOP per clock
// per SM. A bound no kernel can beat, unlike a timed matmul, whose speed depends on the clock the
// card held while it ran: a loop of big bf16 matmuls draws the card's whole power limit (700 W on
// an H200), which holds its clock below the maximum. NVIDIA's datasheets may rate the same product
// at a lower clock: the H100 SXM's and the H200's 989.4 TFLOP/s dense bf16 are 132 x 1830 MHz x
// 4096, where this bound, at their 1980 MHz maximum, is 1070.5.
struct TensorCorePeak {
  double tflops = 0;  // 0: the CPU, or an architecture not listed in peak.cpp
  int sms = 0;
  double max_mhz = 0;
  int flops_per_clock = 0;  // dense bf16 FLOP per clock per SM
};
TensorCorePeak tensor_core_peak(torch::Device device);

}  // namespace amplab
