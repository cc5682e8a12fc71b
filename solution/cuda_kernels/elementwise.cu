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
  // BEGIN SOLUTION
  check_size("grid_stride_blocks", "n", n);
  check_threads("grid_stride_blocks", threads, /*power_of_two=*/false);
  if (sms < 1) bad_argument("grid_stride_blocks", "sms", sms, "need at least one SM");
  if (blocks_per_sm < 1) bad_argument("grid_stride_blocks", "blocks_per_sm", blocks_per_sm, "need at least one block per SM");
  return std::min(ceil_div(n, threads), int64_t{sms} * blocks_per_sm);
  // END SOLUTION
}

__global__ void add_grid_stride_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
                                       int64_t n) {
  // TODO(cuda_kernels-2): A grid-stride loop: thread t of the grid handles items t, t + S, t + 2S...
  // where S is the number of threads in the whole grid, so any grid covers any n. Consecutive
  // threads of a warp touch consecutive floats: each load of the warp is one coalesced 128-byte
  // transaction. Index in int64 (n can exceed 2^31).
  // BEGIN SOLUTION DEVICE
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) c[i] = a[i] + b[i];
  // END SOLUTION
}

void vector_add_grid_stride(const float* a, const float* b, float* c, int64_t n, int threads, cudaStream_t stream) {
  // TODO(cuda_kernels-2): Check n and threads, launch nothing for n == 0 (before any CUDA call:
  // the tests call this without a GPU), then launch the kernel on `stream` with the grid your
  // grid_stride_blocks gives for this GPU (cuda_check.cuh's helpers tell its SMs and how many
  // blocks of this kernel fit on one at a time). check_launch after the launch.
  // BEGIN SOLUTION
  check_size("vector_add_grid_stride", "n", n);
  check_threads("vector_add_grid_stride", threads, /*power_of_two=*/false);
  if (n == 0) return;
  const int64_t blocks = grid_stride_blocks(n, threads, sm_count(), blocks_per_sm(add_grid_stride_kernel, threads));
  add_grid_stride_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(a, b, c, n);
  check_launch("add_grid_stride_kernel");
  // END SOLUTION
}

__global__ void add_float4_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
                                  int64_t n) {
  // TODO(cuda_kernels-3): The grid-stride loop over float4s: one 16-byte load of a and of b and one
  // 16-byte store per step, four times fewer instructions for the same bytes. The launcher
  // guarantees 16-byte aligned pointers here. n need not be a multiple of 4: the last n % 4 floats
  // (the tail) are added one by one.
  // BEGIN SOLUTION DEVICE
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t vectors = n / 4;
  const float4* a4 = reinterpret_cast<const float4*>(a);
  const float4* b4 = reinterpret_cast<const float4*>(b);
  float4* c4 = reinterpret_cast<float4*>(c);
  for (int64_t i = first; i < vectors; i += stride) {
    const float4 x = a4[i], y = b4[i];
    c4[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
  }
  for (int64_t i = vectors * 4 + first; i < n; i += stride) c[i] = a[i] + b[i];  // the tail: < 4 floats
  // END SOLUTION
}

void vector_add_float4(const float* a, const float* b, float* c, int64_t n, int threads, cudaStream_t stream) {
  // TODO(cuda_kernels-3): As vector_add_grid_stride (checks first, nothing to do for n == 0), with
  // a grid for n / 4 float4s. A tensor's data need not be 16-byte aligned (a slice starting at
  // element 1 is not; see aligned16): a misaligned float4 access is an error, so fall back to the
  // one-float kernel when any of a, b, c is misaligned.
  // BEGIN SOLUTION
  check_size("vector_add_float4", "n", n);
  check_threads("vector_add_float4", threads, /*power_of_two=*/false);
  if (n == 0) return;
  if (!aligned16(a) || !aligned16(b) || !aligned16(c)) {
    vector_add_grid_stride(a, b, c, n, threads, stream);
    return;
  }
  const int64_t items = std::max<int64_t>(n / 4, 1);  // float4s; at least one block for a tail-only n
  const int64_t blocks = grid_stride_blocks(items, threads, sm_count(), blocks_per_sm(add_float4_kernel, threads));
  add_float4_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(a, b, c, n);
  check_launch("add_float4_kernel");
  // END SOLUTION
}

}  // namespace cuda_kernels
