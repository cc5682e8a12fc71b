// Lab 7, the stretch's kernels (TODO 7): the launchers of the two casts as CUDA kernels
// (starter/transformer_fp8/fp8_kernels.cu). Torch-free, as in Lab 6: raw device pointers, an
// element count and a stream, so that the .cu file compiles with nvcc alone. The torch-facing
// wrappers (abs_max_fast, to_fp8_fast in transformer_fp8.hpp) check the tensors, pick the stream
// and call these.
#pragma once

#include <cstdint>

// As <driver_types.h> declares it, so that this header needs no CUDA header.
typedef struct CUstream_st* cudaStream_t;

namespace transformer_fp8 {

enum class CastInput { f32, bf16, f16 };  // the element type of x

// TODO(transformer_fp8-7), the stretch: TODO 3's abs_max and to_fp8 as kernels that each read x
// once. The ATen versions pass over memory several times (abs writes a copy, max reads it; to(f32),
// the multiply, the clamp and the cast each read and write a whole tensor): for a large tensor
// that is bandwidth, and in an FP8 linear it eats what the FP8 matmul saved.
//
// *amax = max |x[i]| over i < n, as float. The caller zeroes *amax first (the kernel only raises
// it). n < 0 is an amplab::Error naming the argument; n == 0 launches nothing.
void abs_max_launch(const void* x, CastInput type, int64_t n, float* amax, cudaStream_t stream);
// out[i] = the saturated cast of x[i] * (*scale) (computed in float32) to e4m3 (e5m2 when `e5m2`):
// bit for bit what to_fp8 gives. out holds n bytes. Same argument rules as abs_max_launch.
void to_fp8_launch(const void* x, CastInput type, int64_t n, const float* scale, bool e5m2, void* out,
                   cudaStream_t stream);
// The same cast of a row-major (rows, cols) x, written twice: `out` row-major (rows, cols) and
// `out_t` its transpose, row-major (cols, rows), which the FP8 matmuls of backward need. Copying
// an fp8 tensor's transpose afterwards costs more than the cast itself; here each 64 x 64 tile is
// read once and its bytes leave through shared memory a second time. rows and cols: multiples of
// 16 (what the FP8 matmul needs), else an amplab::Error naming them; x 16-byte aligned.
void to_fp8_transposed_launch(const void* x, CastInput type, int64_t rows, int64_t cols, const float* scale, bool e5m2,
                              void* out, void* out_t, cudaStream_t stream);

}  // namespace transformer_fp8
