// Your copy of this lab's code: fill in every TODO(...) below; the tests tell you which one
// fails. (Instructors: generated from solution/ by scripts/make-starter.py; edit the solution.)
// Lab 6, part 1: element-wise work, c = a + b over n floats. See labs/cuda_kernels/README.md,
// part 1 (grid-stride loops, coalescing, vectorised loads). Every kernel has a host-side launcher:
// the launcher checks the arguments, picks the grid and launches on `stream`.
#include <algorithm>

#include "cuda_check.cuh"
#include "kernels.hpp"

namespace cuda_kernels {

int64_t grid_stride_blocks(int64_t n, int threads, int sms, int blocks_per_sm) {
  // TODO(cuda_kernels-2): The grid of a grid-stride loop. Check the arguments first (check_size,
  // check_threads; sms and blocks_per_sm below 1 are errors too: bad_argument). Enough blocks to
  // give every item its own thread, capped at one wave (sms * blocks_per_sm): a grid-stride loop
  // covers the rest, and blocks beyond one wave would only wait for a free SM. n == 0 gives 0
  // blocks. Mind int64: n can exceed 2^31.
  AMPLAB_TODO("cuda_kernels-2");
}

__global__ void add_grid_stride_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
                                       int64_t n) {
  // TODO(cuda_kernels-2): A grid-stride loop: thread t of the grid handles items t, t + S, t + 2S...
  // where S is the number of threads in the whole grid, so any grid covers any n. Consecutive
  // threads of a warp touch consecutive floats: each load of the warp is one coalesced 128-byte
  // transaction. Index in int64 (n can exceed 2^31).
  AMPLAB_TODO_DEVICE("cuda_kernels-2");
}

void vector_add_grid_stride(const float* a, const float* b, float* c, int64_t n, int threads, cudaStream_t stream) {
  // TODO(cuda_kernels-2): Check n and threads, launch nothing for n == 0 (before any CUDA call:
  // the tests call this without a GPU), then launch the kernel on `stream` with the grid your
  // grid_stride_blocks gives for this GPU (cuda_check.cuh's helpers tell its SMs and how many
  // blocks of this kernel fit on one at a time). check_launch after the launch.
  AMPLAB_TODO("cuda_kernels-2");
}

__global__ void add_float4_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
                                  int64_t n) {
  // TODO(cuda_kernels-3): The grid-stride loop over float4s: one 16-byte load of a and of b and one
  // 16-byte store per step, four times fewer instructions for the same bytes. The launcher
  // guarantees 16-byte aligned pointers here. n need not be a multiple of 4: the last n % 4 floats
  // (the tail) are added one by one.
  AMPLAB_TODO_DEVICE("cuda_kernels-3");
}

void vector_add_float4(const float* a, const float* b, float* c, int64_t n, int threads, cudaStream_t stream) {
  // TODO(cuda_kernels-3): As vector_add_grid_stride (checks first, nothing to do for n == 0), with
  // a grid for n / 4 float4s. A tensor's data need not be 16-byte aligned (a slice starting at
  // element 1 is not; see aligned16): a misaligned float4 access is an error, so fall back to the
  // one-float kernel when any of a, b, c is misaligned.
  AMPLAB_TODO("cuda_kernels-3");
}

}  // namespace cuda_kernels
