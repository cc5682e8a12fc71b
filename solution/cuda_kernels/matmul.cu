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
  // BEGIN SOLUTION DEVICE
  const int col = blockIdx.x * blockDim.x + threadIdx.x, row = blockIdx.y * blockDim.y + threadIdx.y;
  if (row >= m || col >= n) return;
  const float* a_row = a + int64_t{row} * k;
  float acc = 0.f;
  for (int p = 0; p < k; ++p) acc += a_row[p] * b[int64_t{p} * n + col];
  c[int64_t{row} * n + col] = acc;
  // END SOLUTION
}

void matmul_naive(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  // TODO(cuda_kernels-9): Check m, n, k (each >= 0 and an int), nothing for an empty C, C = 0 for
  // k == 0 (no kernel needed: a memset), else a 2D grid of kNaiveX x kNaiveY blocks covering C.
  // BEGIN SOLUTION
  if (!check_matmul_arguments("matmul_naive", m, n, k) || zero_when_k_is_zero(c, m, n, k, sizeof(float), stream)) return;
  const dim3 block(kNaiveX, kNaiveY);
  const dim3 grid(static_cast<unsigned>(ceil_div(n, kNaiveX)), static_cast<unsigned>(ceil_div(m, kNaiveY)));
  matmul_naive_kernel<<<grid, block, 0, stream>>>(a, b, c, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k));
  check_launch("matmul_naive_kernel");
  // END SOLUTION
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
  // BEGIN SOLUTION DEVICE
  __shared__ float a_tile[kTile][kTile];
  __shared__ float b_tile[kTile][kTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int row = blockIdx.y * kTile + ty, col = blockIdx.x * kTile + tx;
  float acc = 0.f;
  for (int k0 = 0; k0 < k; k0 += kTile) {
    a_tile[ty][tx] = (row < m && k0 + tx < k) ? a[int64_t{row} * k + k0 + tx] : 0.f;
    b_tile[ty][tx] = (k0 + ty < k && col < n) ? b[int64_t{k0 + ty} * n + col] : 0.f;
    __syncthreads();
#pragma unroll
    for (int p = 0; p < kTile; ++p) acc += a_tile[ty][p] * b_tile[p][tx];  // a: broadcast; b: 32 banks
    __syncthreads();
  }
  if (row < m && col < n) c[int64_t{row} * n + col] = acc;
  // END SOLUTION
}

void matmul_tiled(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  // TODO(cuda_kernels-10): As matmul_naive, with kTile x kTile blocks.
  // BEGIN SOLUTION
  if (!check_matmul_arguments("matmul_tiled", m, n, k) || zero_when_k_is_zero(c, m, n, k, sizeof(float), stream)) return;
  const dim3 block(kTile, kTile);
  const dim3 grid(static_cast<unsigned>(ceil_div(n, kTile)), static_cast<unsigned>(ceil_div(m, kTile)));
  matmul_tiled_kernel<<<grid, block, 0, stream>>>(a, b, c, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k));
  check_launch("matmul_tiled_kernel");
  // END SOLUTION
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
  // BEGIN SOLUTION DEVICE
  __shared__ __align__(16) float a_tile[2][kBK][kBM];  // A's tile transposed: [k][row]
  __shared__ __align__(16) float b_tile[2][kBK][kBN];
  const int tid = threadIdx.x;
  const int tx = tid % 16, ty = tid / 16;
  const int row0 = blockIdx.y * kBM, col0 = blockIdx.x * kBN;
  // Global -> shared, one float4 each: A's row a_row, k a_k..a_k+3; B's row b_row, columns b_col..b_col+3.
  const int a_row = tid / 2, a_k = (tid % 2) * 4;
  const int b_row = tid / 32, b_col = (tid % 32) * 4;
  float4 a_next, b_next;
  auto load = [&](int k0) {
    if constexpr (kFast) {
      a_next = *reinterpret_cast<const float4*>(a + int64_t{row0 + a_row} * k + k0 + a_k);
      b_next = *reinterpret_cast<const float4*>(b + int64_t{k0 + b_row} * n + col0 + b_col);
    } else {
      float av[4], bv[4];
      const int r = row0 + a_row, kb = k0 + b_row;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        av[i] = (r < m && k0 + a_k + i < k) ? a[int64_t{r} * k + k0 + a_k + i] : 0.f;
        bv[i] = (kb < k && col0 + b_col + i < n) ? b[int64_t{kb} * n + col0 + b_col + i] : 0.f;
      }
      a_next = make_float4(av[0], av[1], av[2], av[3]);
      b_next = make_float4(bv[0], bv[1], bv[2], bv[3]);
    }
  };
  auto store = [&](int buffer) {
    a_tile[buffer][a_k + 0][a_row] = a_next.x;
    a_tile[buffer][a_k + 1][a_row] = a_next.y;
    a_tile[buffer][a_k + 2][a_row] = a_next.z;
    a_tile[buffer][a_k + 3][a_row] = a_next.w;
    *reinterpret_cast<float4*>(&b_tile[buffer][b_row][b_col]) = b_next;
  };

  float acc[8][8] = {};
  load(0);
  store(0);
  __syncthreads();
  int buffer = 0;
  for (int k0 = 0; k0 < k; k0 += kBK) {
    const bool more = k0 + kBK < k;
    if (more) load(k0 + kBK);  // in flight while the FMAs below run
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      const float4 a_lo = *reinterpret_cast<const float4*>(&a_tile[buffer][kk][ty * 4]);
      const float4 a_hi = *reinterpret_cast<const float4*>(&a_tile[buffer][kk][64 + ty * 4]);
      const float4 b_lo = *reinterpret_cast<const float4*>(&b_tile[buffer][kk][tx * 4]);
      const float4 b_hi = *reinterpret_cast<const float4*>(&b_tile[buffer][kk][64 + tx * 4]);
      const float av[8] = {a_lo.x, a_lo.y, a_lo.z, a_lo.w, a_hi.x, a_hi.y, a_hi.z, a_hi.w};
      const float bv[8] = {b_lo.x, b_lo.y, b_lo.z, b_lo.w, b_hi.x, b_hi.y, b_hi.z, b_hi.w};
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    if (more) {
      store(buffer ^ 1);  // the copy every thread finished reading before the last __syncthreads
      __syncthreads();
      buffer ^= 1;
    }
  }

#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int row = row0 + (i / 4) * 64 + ty * 4 + i % 4;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int col = col0 + half * 64 + tx * 4;
      const float* v = &acc[i][half * 4];
      if constexpr (kFast) {
        *reinterpret_cast<float4*>(c + int64_t{row} * n + col) = make_float4(v[0], v[1], v[2], v[3]);
      } else if (row < m) {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (col + j < n) c[int64_t{row} * n + col + j] = v[j];
      }
    }
  }
  // END SOLUTION
}

void matmul_register_blocked(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k,
                             cudaStream_t stream) {
  // TODO(cuda_kernels-11): Checks as in matmul_naive; a grid of kBM x kBN tiles of kBlockThreads
  // threads; the fast kernel when the sizes are multiples of the tiles and the pointers 16-byte
  // aligned (aligned16), else the one that checks its edges.
  // BEGIN SOLUTION
  if (!check_matmul_arguments("matmul_register_blocked", m, n, k) ||
      zero_when_k_is_zero(c, m, n, k, sizeof(float), stream))
    return;
  const dim3 grid(static_cast<unsigned>(ceil_div(n, kBN)), static_cast<unsigned>(ceil_div(m, kBM)));
  const bool fast = m % kBM == 0 && n % kBN == 0 && k % kBK == 0 && aligned16(a) && aligned16(b) && aligned16(c);
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  if (fast)
    matmul_register_blocked_kernel<true><<<grid, kBlockThreads, 0, stream>>>(a, b, c, mi, ni, ki);
  else
    matmul_register_blocked_kernel<false><<<grid, kBlockThreads, 0, stream>>>(a, b, c, mi, ni, ki);
  check_launch("matmul_register_blocked_kernel");
  // END SOLUTION
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
  // BEGIN SOLUTION DEVICE
  using namespace nvcuda;
  __shared__ __align__(32) __nv_bfloat16 a_tile[kWM][kWK + kPad];
  __shared__ __align__(32) __nv_bfloat16 b_tile[kWK][kWN + kPad];
  __shared__ __align__(32) float scratch[kWarps][16][16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_row = (warp / 4) * 64, warp_col = (warp % 4) * 32;
  const int row0 = blockIdx.y * kWM, col0 = blockIdx.x * kWN;
  const __nv_bfloat16 zero = __float2bfloat16(0.f);

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4][2];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.f);

  for (int k0 = 0; k0 < k; k0 += kWK) {
    for (int chunk = threadIdx.x; chunk < kWM * kWK / 8; chunk += kWarps * 32) {  // 8 bf16 = 16 bytes each
      const int r = chunk / (kWK / 8), kc = (chunk % (kWK / 8)) * 8;
      if constexpr (kFast) {
        *reinterpret_cast<uint4*>(&a_tile[r][kc]) = *reinterpret_cast<const uint4*>(a + int64_t{row0 + r} * k + k0 + kc);
      } else {
        for (int e = 0; e < 8; ++e)
          a_tile[r][kc + e] = (row0 + r < m && k0 + kc + e < k) ? a[int64_t{row0 + r} * k + k0 + kc + e] : zero;
      }
    }
    for (int chunk = threadIdx.x; chunk < kWK * kWN / 8; chunk += kWarps * 32) {
      const int r = chunk / (kWN / 8), nc = (chunk % (kWN / 8)) * 8;
      if constexpr (kFast) {
        *reinterpret_cast<uint4*>(&b_tile[r][nc]) = *reinterpret_cast<const uint4*>(b + int64_t{k0 + r} * n + col0 + nc);
      } else {
        for (int e = 0; e < 8; ++e)
          b_tile[r][nc + e] = (k0 + r < k && col0 + nc + e < n) ? b[int64_t{k0 + r} * n + col0 + nc + e] : zero;
      }
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kWK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a_frag[4];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b_frag[2];
#pragma unroll
      for (int i = 0; i < 4; ++i) wmma::load_matrix_sync(a_frag[i], &a_tile[warp_row + i * 16][kk], kWK + kPad);
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(b_frag[j], &b_tile[kk][warp_col + j * 16], kWN + kPad);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a_frag[i], b_frag[j], acc[i][j]);
    }
    __syncthreads();  // before the next step's loads overwrite the tiles
  }

  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 2; ++j) {
      wmma::store_matrix_sync(&scratch[warp][0][0], acc[i][j], 16, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < 256; e += 32) {
        const int row = row0 + warp_row + i * 16 + e / 16, col = col0 + warp_col + j * 16 + e % 16;
        if (row < m && col < n) c[int64_t{row} * n + col] = __float2bfloat16(scratch[warp][e / 16][e % 16]);
      }
      __syncwarp();  // before the next fragment overwrites the scratch
    }
  }
  // END SOLUTION
#endif
}

void matmul_wmma_bf16(const void* a, const void* b, void* c, int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  // TODO(cuda_kernels-12): (stretch) Checks and k == 0 as in matmul_naive (C is bf16: 2 bytes per
  // element); a grid of kWM x kWN tiles of kWarps warps; the fast kernel when it may.
  // BEGIN SOLUTION
  if (!check_matmul_arguments("matmul_wmma_bf16", m, n, k) || zero_when_k_is_zero(c, m, n, k, 2, stream)) return;
  const auto* a16 = static_cast<const __nv_bfloat16*>(a);
  const auto* b16 = static_cast<const __nv_bfloat16*>(b);
  auto* c16 = static_cast<__nv_bfloat16*>(c);
  const dim3 grid(static_cast<unsigned>(ceil_div(n, kWN)), static_cast<unsigned>(ceil_div(m, kWM)));
  const bool fast = m % kWM == 0 && n % kWN == 0 && k % kWK == 0 && aligned16(a) && aligned16(b);
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  if (fast)
    matmul_wmma_bf16_kernel<true><<<grid, kWarps * 32, 0, stream>>>(a16, b16, c16, mi, ni, ki);
  else
    matmul_wmma_bf16_kernel<false><<<grid, kWarps * 32, 0, stream>>>(a16, b16, c16, mi, ni, ki);
  check_launch("matmul_wmma_bf16_kernel");
  // END SOLUTION
}

}  // namespace cuda_kernels
