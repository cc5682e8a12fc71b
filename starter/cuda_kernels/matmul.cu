// Your copy of this lab's code: fill in every TODO(...) below; the tests tell you which one
// fails. (Instructors: generated from solution/ by scripts/make-starter.py; edit the solution.)
// Lab 6, part 4: C = A B in fp32 (naive, shared-memory tiles, register blocking) and in bf16 on
// the tensor cores (WMMA). A (m, k), B (k, n), C (m, n), row-major. See labs/cuda_kernels/README.md,
// part 4 (data reuse, arithmetic intensity, the roofline).
#include <mma.h>

#include <climits>

#include "cuda_check.cuh"
#include "kernels.hpp"

namespace cuda_kernels {

namespace {

// Sizes are ints inside the kernels; m == 0 or n == 0 is nothing to do, k == 0 gives C = 0.
// Returns whether there is anything to compute.
[[maybe_unused]] bool check_matmul_arguments(const char* function, int64_t m, int64_t n, int64_t k) {
  check_size(function, "m", m);
  check_size(function, "n", n);
  check_size(function, "k", k);
  if (m > INT_MAX) bad_argument(function, "m", m, "at most 2^31 - 1");
  if (n > INT_MAX) bad_argument(function, "n", n, "at most 2^31 - 1");
  if (k > INT_MAX) bad_argument(function, "k", k, "at most 2^31 - 1");
  return m > 0 && n > 0;
}

// C = 0 (k == 0: every dot product is empty). Returns true when that was all.
[[maybe_unused]] bool zero_when_k_is_zero(void* c, int64_t m, int64_t n, int64_t k, size_t element_bytes, cudaStream_t stream) {
  if (k != 0) return false;
  check_cuda(cudaMemsetAsync(c, 0, m * n * element_bytes, stream), "cudaMemsetAsync");
  return true;
}

}  // namespace

// ---- naive -------------------------------------------------------------------------------------

[[maybe_unused]] constexpr int kNaiveX = 32, kNaiveY = 8;  // threads per block: x along C's columns

__global__ void matmul_naive_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
                                    int m, int n, int k) {
  // TODO(cuda_kernels-9): Thread (x, y) of the grid computes C[row][col] (row from y, col from x),
  // the dot product of A's row and B's column, summed in a register. With x along C's columns, the
  // 32 threads of a warp read 32 consecutive floats of a row of B (coalesced) and the same float
  // of A (one broadcast). Threads past the edge of C do nothing. Offsets in int64 (m * k can pass
  // 2^31).
  AMPLAB_TODO_DEVICE("cuda_kernels-9");
}

void matmul_naive(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  // TODO(cuda_kernels-9): Check m, n, k (each >= 0 and an int), nothing for an empty C, C = 0 for
  // k == 0 (no kernel needed: a memset), else a 2D grid of kNaiveX x kNaiveY blocks covering C.
  AMPLAB_TODO("cuda_kernels-9");
}

// ---- shared-memory tiles -----------------------------------------------------------------------

[[maybe_unused]] constexpr int kTile = 32;  // a block of kTile x kTile threads computes a kTile x kTile tile of C

__global__ void matmul_tiled_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
                                    int m, int n, int k) {
  // TODO(cuda_kernels-10): One output per thread as before, but the block walks along k in steps
  // of kTile: each step, its threads load a kTile x kTile tile of A and one of B into shared memory
  // (one float each, coalesced, zeros past the edges), __syncthreads, add the kTile products of
  // their row and column from shared memory, __syncthreads again before the next tiles overwrite
  // these. Each float loaded from global memory is now used kTile times. Check the reads of the
  // inner loop for bank conflicts (which index varies across a warp?).
  AMPLAB_TODO_DEVICE("cuda_kernels-10");
}

void matmul_tiled(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  // TODO(cuda_kernels-10): As matmul_naive, with kTile x kTile blocks.
  AMPLAB_TODO("cuda_kernels-10");
}

// ---- register blocking -------------------------------------------------------------------------

// A block of kBlockThreads threads computes a kBM x kBN tile of C, walking along k in steps of kBK;
// each thread keeps an 8 x 8 tile of C in registers.
[[maybe_unused]] constexpr int kBM = 128, kBN = 128, kBK = 8, kBlockThreads = 256;

template <bool kFast>  // kFast: m, n multiples of 128, k of 8, 16-byte aligned: no edge checks, float4 everywhere
__global__ void __launch_bounds__(kBlockThreads)
    matmul_register_blocked_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
                                   int m, int n, int k) {
  // TODO(cuda_kernels-11): Each thread computes 64 outputs (8 rows x 8 columns of the block's
  // kBM x kBN tile) and keeps them in registers: for each k of the shared tiles it reads 8 values
  // of A and 8 of B for 64 FMAs, where the tiled kernel did 2 loads per FMA. The ideas (README
  // part 4):
  // - Shared tiles of A and B per step of kBK along k, loaded by the whole block with 16-byte
  //   loads. Store A's tile so that the 8 values of A a thread needs for one k are contiguous in
  //   shared memory: then they too are read as float4s.
  // - The map from a thread to its 8 rows and 8 columns is yours to choose, and it decides the
  //   shared-memory banks a warp's float4 reads hit: work it out on paper for one warp (which
  //   addresses do its 32 lanes read at once?) and choose one where they do not conflict.
  // - Double buffering: while the FMAs of this step run, the next step's tiles are already on
  //   their way from global memory (into registers first, into the other shared buffer after the
  //   math), so one __syncthreads per step suffices and the loads' latency hides behind the FMAs.
  // - Outside the fast case (kFast false), every load past an edge of A or B reads 0 and every
  //   store past an edge of C is skipped; one float at a time (rows of A or B may not be aligned).
  // Count the registers (64 accumulators and friends): __launch_bounds__ tells the compiler 256
  // threads, so it must fit them in 255 registers without spilling (nvcc -Xptxas -v says).
  AMPLAB_TODO_DEVICE("cuda_kernels-11");
}

void matmul_register_blocked(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k,
                             cudaStream_t stream) {
  // TODO(cuda_kernels-11): Checks as in matmul_naive; a grid of kBM x kBN tiles of kBlockThreads
  // threads; the fast kernel when the sizes are multiples of the tiles and the pointers 16-byte
  // aligned (aligned16), else the one that checks its edges.
  AMPLAB_TODO("cuda_kernels-11");
}

// ---- tensor cores: WMMA, bf16 in, fp32 sums, bf16 out ----------------------------------------------

// A block of 8 warps computes a 128 x 128 tile of C, walking along k in steps of 32; warp w
// computes the 64 x 32 block at rows (w / 4) * 64, columns (w % 4) * 32: 4 x 2 fragments of 16 x 16.
[[maybe_unused]] constexpr int kWM = 128, kWN = 128, kWK = 32, kWarps = 8;
[[maybe_unused]] constexpr int kPad = 8;  // bf16s added to each shared row: spreads the rows over the banks; keeps 32-byte alignment

template <bool kFast>  // kFast: m, n multiples of 128, k of 32, 16-byte aligned
__global__ void __launch_bounds__(kWarps * 32)
    matmul_wmma_bf16_kernel(const __nv_bfloat16* __restrict__ a, const __nv_bfloat16* __restrict__ b,
                            __nv_bfloat16* __restrict__ c, int m, int n, int k) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800  // bf16 tensor cores: Ampere and later
  // TODO(cuda_kernels-12): (stretch) nvcuda::wmma (<mma.h>; the CUDA C++ Programming Guide, "Warp
  // Matrix Functions") exposes the tensor cores to a warp: fragments of A, of B and of an fp32
  // accumulator for 16 x 16 x 16 bf16 products, and calls that load a fragment from memory,
  // multiply-accumulate, and store one. The whole warp calls each one together. The plan:
  // - Shared tiles of A (kWM x kWK) and B (kWK x kWN) per step of k, loaded by the whole block
  //   (16-byte chunks of 8 bf16 in the fast case; one element at a time, zeros past the edges,
  //   otherwise). load_matrix_sync needs 32-byte aligned addresses and a leading dimension that is
  //   a multiple of 8 elements: pad each shared row by kPad.
  // - Each warp keeps 4 x 2 accumulator fragments (its 64 x 32 block of C) across the whole loop.
  // - The epilogue: an accumulator fragment's layout is opaque, so store it to shared memory
  //   (a 16 x 16 float scratch per warp), then let the lanes round to bf16 and write the elements
  //   that are inside C.
  AMPLAB_TODO_DEVICE("cuda_kernels-12");
#endif
}

void matmul_wmma_bf16(const void* a, const void* b, void* c, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  // TODO(cuda_kernels-12): (stretch) Checks and k == 0 as in matmul_naive (C is bf16: 2 bytes per
  // element); a grid of kWM x kWN tiles of kWarps warps; the fast kernel when it may.
  AMPLAB_TODO("cuda_kernels-12");
}

}  // namespace cuda_kernels
