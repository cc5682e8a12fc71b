// Your copy of this lab's code: fill in every TODO(...) below; the tests tell you which one
// fails. (Instructors: generated from solution/ by scripts/make-starter.py; edit the solution.)
// Lab 6, part 3: 2D convolution of a one-channel image with a small filter (3x3, 5x5), zero
// padding, output the size of the image. See labs/cuda_kernels/README.md, part 3 (tiling with a
// halo). The naive kernel is given: it shows the indexing; the tiled one is yours.
#include "cuda_check.cuh"
#include "kernels.hpp"

namespace cuda_kernels {

namespace {

// Block of the naive kernel: 32 x 8 threads, one output pixel each (x fastest: a warp reads and
// writes 32 consecutive pixels of a row).
constexpr int kNaiveX = 32, kNaiveY = 8;

void check_conv_arguments(const char* function, int64_t h, int64_t w, int radius) {
  check_size(function, "h", h);
  check_size(function, "w", w);
  if (radius != 1 && radius != 2) bad_argument(function, "radius", radius, "filters are 3x3 (radius 1) or 5x5 (radius 2)");
  // Grids are at most 65535 blocks high (8 rows per block of the naive kernel); x is an int.
  if (h > int64_t{65535} * kNaiveY) bad_argument(function, "h", h, "at most 524280 rows");
  if (w > (int64_t{1} << 30)) bad_argument(function, "w", w, "at most 2^30 columns");
}

}  // namespace

__global__ void conv2d_naive_kernel(const float* __restrict__ image, int h, int w, const float* __restrict__ filter,
                                    int radius, float* __restrict__ out) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= w || y >= h) return;
  const int size = 2 * radius + 1;
  float acc = 0.f;
  for (int dy = -radius; dy <= radius; ++dy) {
    const int yy = y + dy;
    if (yy < 0 || yy >= h) continue;  // zero padding: outside rows add nothing
    for (int dx = -radius; dx <= radius; ++dx) {
      const int xx = x + dx;
      if (xx >= 0 && xx < w) acc += filter[(dy + radius) * size + dx + radius] * image[int64_t{yy} * w + xx];
    }
  }
  out[int64_t{y} * w + x] = acc;
}

void conv2d_naive(const float* image, int64_t h, int64_t w, const float* filter, int radius, float* out,
                  cudaStream_t stream) {
  check_conv_arguments("conv2d_naive", h, w, radius);
  if (h == 0 || w == 0) return;
  const dim3 block(kNaiveX, kNaiveY);
  const dim3 grid(static_cast<unsigned>(ceil_div(w, kNaiveX)), static_cast<unsigned>(ceil_div(h, kNaiveY)));
  conv2d_naive_kernel<<<grid, block, 0, stream>>>(image, static_cast<int>(h), static_cast<int>(w), filter, radius, out);
  check_launch("conv2d_naive_kernel");
}

// The tiled kernel's shape: each block computes a kTile x kTile square of the output with
// kTile x kTileRows threads, each thread kTile / kTileRows pixels of one column.
[[maybe_unused]] constexpr int kTile = 32, kTileRows = 8;

template <int R>
__global__ void conv2d_tiled_kernel(const float* __restrict__ image, int h, int w, const float* __restrict__ filter,
                                    float* __restrict__ out) {
  // TODO(cuda_kernels-8): A block computes one kTile x kTile output tile. Its inputs are the tile
  // plus a halo of R pixels on every side: (kTile + 2R)^2 floats, loaded once into shared memory by
  // all the block's threads together (coalesced: consecutive threads, consecutive x), zeros
  // outside the image. The filter is small: into shared memory (or registers) too. One
  // __syncthreads, then each thread computes its outputs from shared memory only: each input is
  // now read from global memory ~1.1 times instead of (2R+1)^2 times. Mind the tiles at the right
  // and bottom edges (partly outside the image: write only the pixels inside), and bank conflicts
  // (a warp reading 32 consecutive floats of a row is conflict-free).
  AMPLAB_TODO_DEVICE("cuda_kernels-8");
}

void conv2d_tiled(const float* image, int64_t h, int64_t w, const float* filter, int radius, float* out,
                  cudaStream_t stream) {
  // TODO(cuda_kernels-8): Check the arguments as conv2d_naive does (radius 1 or 2 only: the kernel
  // is a template on R, so that its loops unroll and the tile's size is known at compile time),
  // nothing to do for an empty image, then a grid of kTile x kTile tiles covering the image.
  AMPLAB_TODO("cuda_kernels-8");
}

}  // namespace cuda_kernels
