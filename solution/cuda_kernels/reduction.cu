// Lab 6, part 2: the sum of n floats, through the classic sequence of optimisations (M. Harris,
// "Optimizing Parallel Reduction in CUDA"). See labs/cuda_kernels/README.md, part 2 (shared memory,
// bank conflicts, divergence, warp shuffles). Each version is a kernel that sums a share of its
// input per block into one partial sum per block, and a launcher that runs it in passes (given:
// reduce_in_passes) until one value is left.
#include <algorithm>

#include "cuda_check.cuh"
#include "kernels.hpp"

namespace cuda_kernels {

namespace {

// Partial sums per pass: at most ceil(count / 32) (blocks of >= 32 threads, >= 1 input each),
// kept in two buffers that passes alternate between, each a multiple of 64 floats (256 bytes, so
// the second one is float4-aligned too).
int64_t first_buffer_floats(int64_t n) { return ceil_div(ceil_div(n, 32), 64) * 64; }

}  // namespace

int64_t reduce_workspace_floats(int64_t n) {
  check_size("reduce_workspace_floats", "n", n);
  return first_buffer_floats(n) + ceil_div(ceil_div(n, 32 * 32) + 1, 64) * 64;
}

// Given: sums x[0..n) into out[0] in passes. Each pass launches `pass(in, count, partial, blocks)`:
// a kernel whose `blocks` blocks each write the sum of their share of in[0..count) to
// partial[block]. A pass gets ceil(count / (threads * per_thread)) blocks, at most `max_blocks`
// (then its kernel must loop over the rest: grid-stride). The partial sums are the next pass's
// input, until a pass has one block, which writes to out. n == 0 writes 0.
template <class Pass>
void reduce_in_passes(const char* name, const float* x, int64_t n, float* out, float* workspace, int threads,
                      int64_t per_thread, int64_t max_blocks, cudaStream_t stream, Pass pass) {
  if (n == 0) {
    check_cuda(cudaMemsetAsync(out, 0, sizeof(float), stream), name);
    return;
  }
  float* buffers[2] = {workspace, workspace + first_buffer_floats(n)};
  const float* in = x;
  int64_t count = n;
  for (int p = 0;; ++p) {
    const int64_t blocks = std::min(ceil_div(count, threads * per_thread), max_blocks);
    float* partial = blocks == 1 ? out : buffers[p % 2];
    pass(in, count, partial, static_cast<unsigned>(blocks));
    check_launch(name);
    if (blocks == 1) return;
    in = partial;
    count = blocks;
  }
}

// ---- 1. interleaved addressing ------------------------------------------------------------------

__global__ void reduce_interleaved_kernel(const float* __restrict__ in, int64_t n, float* __restrict__ partial) {
  // TODO(cuda_kernels-4): Block b sums in[b * blockDim.x ...] (one input per thread; 0 past n).
  // Each thread puts its input in shared memory (dynamic: extern __shared__, sized by the launch);
  // then a tree in log2(blockDim.x) steps: at step s = 1, 2, 4, ... the threads whose index is a
  // multiple of 2s add the element s further on into their own. Every step reads what the previous
  // one wrote: __syncthreads() between steps, reached by all threads of the block (not inside a
  // branch only some take). Thread 0 writes the block's sum to partial[blockIdx.x].
  // (The `tid % (2s)` test leaves most threads of each warp idle but waiting: divergence. Part 2
  // of the README measures what that costs.)
  // BEGIN SOLUTION DEVICE
  extern __shared__ float sums[];
  const unsigned tid = threadIdx.x;
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + tid;
  sums[tid] = i < n ? in[i] : 0.f;
  __syncthreads();
  for (unsigned s = 1; s < blockDim.x; s *= 2) {
    if (tid % (2 * s) == 0) sums[tid] += sums[tid + s];
    __syncthreads();
  }
  if (tid == 0) partial[blockIdx.x] = sums[0];
  // END SOLUTION
}

void reduce_interleaved(const float* x, int64_t n, float* out, float* workspace, int threads, cudaStream_t stream) {
  // TODO(cuda_kernels-4): Check n and threads (a power of two: check_threads), then run the kernel
  // through reduce_in_passes: one input per thread, no cap on the blocks (the tree kernels do not
  // loop), `threads` floats of dynamic shared memory per block (the third launch parameter).
  // BEGIN SOLUTION
  check_size("reduce_interleaved", "n", n);
  check_threads("reduce_interleaved", threads, /*power_of_two=*/true);
  reduce_in_passes("reduce_interleaved_kernel", x, n, out, workspace, threads, /*per_thread=*/1,
                   /*max_blocks=*/INT32_MAX, stream, [&](const float* in, int64_t count, float* partial, unsigned blocks) {
                     reduce_interleaved_kernel<<<blocks, threads, threads * sizeof(float), stream>>>(in, count, partial);
                   });
  // END SOLUTION
}

// ---- 2. sequential addressing ------------------------------------------------------------------

__global__ void reduce_sequential_kernel(const float* __restrict__ in, int64_t n, float* __restrict__ partial) {
  // TODO(cuda_kernels-5): The same tree, turned around: the distance between the two elements an add
  // combines starts large and halves at each step, and the threads that work at a step are the
  // first ones, contiguous. Then whole warps work or whole warps skip (no divergence until fewer
  // than 32 threads work), and the 32 threads of a warp read 32 consecutive words: 32 different
  // banks, no bank conflict. The same rule for __syncthreads as TODO 4.
  // BEGIN SOLUTION DEVICE
  extern __shared__ float sums[];
  const unsigned tid = threadIdx.x;
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + tid;
  sums[tid] = i < n ? in[i] : 0.f;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
    if (tid < s) sums[tid] += sums[tid + s];
    __syncthreads();
  }
  if (tid == 0) partial[blockIdx.x] = sums[0];
  // END SOLUTION
}

void reduce_sequential(const float* x, int64_t n, float* out, float* workspace, int threads, cudaStream_t stream) {
  // TODO(cuda_kernels-5): As reduce_interleaved, with the sequential kernel.
  // BEGIN SOLUTION
  check_size("reduce_sequential", "n", n);
  check_threads("reduce_sequential", threads, /*power_of_two=*/true);
  reduce_in_passes("reduce_sequential_kernel", x, n, out, workspace, threads, /*per_thread=*/1,
                   /*max_blocks=*/INT32_MAX, stream, [&](const float* in, int64_t count, float* partial, unsigned blocks) {
                     reduce_sequential_kernel<<<blocks, threads, threads * sizeof(float), stream>>>(in, count, partial);
                   });
  // END SOLUTION
}

// ---- 3. first add during load ------------------------------------------------------------------

__global__ void reduce_first_add_kernel(const float* __restrict__ in, int64_t n, float* __restrict__ partial) {
  // TODO(cuda_kernels-6): Half the blocks: block b covers 2 * blockDim.x inputs, and each thread
  // adds its two (blockDim.x apart, so that both loads of a warp stay coalesced; 0 past n) before
  // writing shared memory. Then the sequential tree. In the first tree step half the threads were
  // idle; now every thread does an add while the loads are in flight.
  // BEGIN SOLUTION DEVICE
  extern __shared__ float sums[];
  const unsigned tid = threadIdx.x;
  const int64_t i = int64_t{blockIdx.x} * (2 * blockDim.x) + tid;
  float v = i < n ? in[i] : 0.f;
  if (i + blockDim.x < n) v += in[i + blockDim.x];
  sums[tid] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
    if (tid < s) sums[tid] += sums[tid + s];
    __syncthreads();
  }
  if (tid == 0) partial[blockIdx.x] = sums[0];
  // END SOLUTION
}

void reduce_first_add(const float* x, int64_t n, float* out, float* workspace, int threads, cudaStream_t stream) {
  // TODO(cuda_kernels-6): As reduce_sequential, with two inputs per thread.
  // BEGIN SOLUTION
  check_size("reduce_first_add", "n", n);
  check_threads("reduce_first_add", threads, /*power_of_two=*/true);
  reduce_in_passes("reduce_first_add_kernel", x, n, out, workspace, threads, /*per_thread=*/2,
                   /*max_blocks=*/INT32_MAX, stream, [&](const float* in, int64_t count, float* partial, unsigned blocks) {
                     reduce_first_add_kernel<<<blocks, threads, threads * sizeof(float), stream>>>(in, count, partial);
                   });
  // END SOLUTION
}

// ---- 4. warp shuffles, grid-stride float4 loads, two passes -------------------------------------

// Inputs per thread of the last version: its first pass leaves one partial sum per block, few
// enough (blocks <= one wave) that the second pass is one block.
[[maybe_unused]] constexpr int64_t kWarpPerThread = 8;

__global__ void reduce_warp_shuffle_kernel(const float* __restrict__ in, int64_t n, float* __restrict__ partial) {
  // TODO(cuda_kernels-7): Three changes at once.
  // 1. Each thread first sums many inputs in a register: a grid-stride loop (the launcher caps the
  //    grid at one wave), with float4 loads when `in` is 16-byte aligned (else one float at a time;
  //    mind the tail of n % 4). Unrolling the loop (several independent loads in flight per
  //    thread) is what reaches the memory's bandwidth.
  // 2. Within a warp, no shared memory and no __syncthreads: __shfl_down_sync(0xffffffff, v, k)
  //    reads v from the lane k above, so 5 steps (k = 16, 8, 4, 2, 1) leave the warp's sum in lane 0.
  // 3. Lane 0 of each warp writes its sum to shared memory (at most 32 warps); after one
  //    __syncthreads the first warp sums those the same way and writes partial[blockIdx.x].
  // BEGIN SOLUTION DEVICE
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  float sum = 0.f;
  if (aligned16(in)) {
    const float4* in4 = reinterpret_cast<const float4*>(in);
    const int64_t vectors = n / 4;
    int64_t i = first;
    for (; i + 3 * stride < vectors; i += 4 * stride) {  // four loads in flight per thread
      const float4 p = in4[i], q = in4[i + stride], r = in4[i + 2 * stride], s = in4[i + 3 * stride];
      sum += ((p.x + p.y) + (p.z + p.w)) + ((q.x + q.y) + (q.z + q.w)) + ((r.x + r.y) + (r.z + r.w)) +
             ((s.x + s.y) + (s.z + s.w));
    }
    for (; i < vectors; i += stride) {
      const float4 p = in4[i];
      sum += (p.x + p.y) + (p.z + p.w);
    }
    for (int64_t j = vectors * 4 + first; j < n; j += stride) sum += in[j];  // the tail: < 4 floats
  } else {
    for (int64_t j = first; j < n; j += stride) sum += in[j];
  }
  for (int k = 16; k > 0; k /= 2) sum += __shfl_down_sync(0xffffffffu, sum, k);
  __shared__ float warp_sums[32];
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = sum;
  __syncthreads();
  if (warp == 0) {
    sum = lane < blockDim.x / 32 ? warp_sums[lane] : 0.f;
    for (int k = 16; k > 0; k /= 2) sum += __shfl_down_sync(0xffffffffu, sum, k);
    if (lane == 0) partial[blockIdx.x] = sum;
  }
  // END SOLUTION
}

void reduce_warp_shuffle(const float* x, int64_t n, float* out, float* workspace, int threads, cudaStream_t stream) {
  // TODO(cuda_kernels-7): Checks as before, then the kernel through reduce_in_passes with a grid
  // of at most one wave (sm_count() * blocks_per_sm(kernel, threads)) and enough inputs per
  // thread (kWarpPerThread) that the second pass is a single block. (Or one pass: every block
  // atomicAdds its sum into *out, zeroed first; then the order of the adds, and the last bits of
  // the sum, change from run to run.)
  // BEGIN SOLUTION
  check_size("reduce_warp_shuffle", "n", n);
  check_threads("reduce_warp_shuffle", threads, /*power_of_two=*/true);
  const int64_t wave = n == 0 ? 1 : int64_t{sm_count()} * blocks_per_sm(reduce_warp_shuffle_kernel, threads);
  reduce_in_passes("reduce_warp_shuffle_kernel", x, n, out, workspace, threads, kWarpPerThread, wave, stream,
                   [&](const float* in, int64_t count, float* partial, unsigned blocks) {
                     reduce_warp_shuffle_kernel<<<blocks, threads, 0, stream>>>(in, count, partial);
                   });
  // END SOLUTION
}

}  // namespace cuda_kernels
