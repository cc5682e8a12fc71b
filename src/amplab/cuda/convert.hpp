// A widening copy, bf16 -> fp32, of dense GPU tensors: 16-byte loads of eight bf16 values, two
// 16-byte stores. PyTorch's copy_ converts bf16 to fp32 with a kernel that is not vectorised
// (about 0.2 ms for a 64 M-element gradient on an H200, where this takes about half); DDP's bf16
// compression writes each averaged gradient back into fp32 with it (dist/ddp.hpp). The values are
// copy_'s to the bit: a bf16 value is the upper half of the float's bits, NaN payloads included.
#pragma once

#include <ATen/core/Tensor.h>

namespace amplab::cuda {

// Both on the same CUDA device, `from` bf16 and `to` float, the same sizes and strides, dense
// (no gaps, no overlaps), `from` 16-byte and `to` 16-byte aligned. Anything else: use copy_.
bool bf16_to_float_supported(const at::Tensor& from, const at::Tensor& to);
// to = from, on the current stream.
void bf16_to_float(const at::Tensor& from, const at::Tensor& to);

}  // namespace amplab::cuda
