// Tensors that a careless copy would change, for the safetensors tests (safetensors_test.cpp) and
// the tool that Python's package checks (safetensors_tool.cpp, safetensors_interop.py).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "amplab/state/safetensors.hpp"

namespace amplab::test {

// A tensor of `dtype` holding exactly these bit patterns (the integer type of the same width).
template <class Bits>
inline torch::Tensor from_bits(std::vector<Bits> bits, torch::ScalarType bits_type, torch::ScalarType dtype) {
  return torch::tensor(bits, torch::dtype(bits_type)).view(dtype);
}

// Every dtype, with the values a careless copy loses: NaNs with payloads (quiet and signalling),
// -0.0, infinities, the smallest and largest subnormals, the extremes of each integer type, and
// every byte pattern of the 8-bit floats.
inline NamedTensors awkward_tensors() {
  NamedTensors out;
  out.emplace_back("f64", from_bits<int64_t>({0x7ff8000000000123, 0x7ff0000000000001, static_cast<int64_t>(0x8000000000000000ull),
                                              0x0000000000000001, 0x000fffffffffffff, 0x7ff0000000000000, 0x3ff0000000000000},
                                             torch::kInt64, torch::kFloat64));
  out.emplace_back("f32", from_bits<int32_t>({0x7fc00123, 0x7f800001, static_cast<int32_t>(0xffc00001), static_cast<int32_t>(0x80000000),
                                              0x00000001, 0x007fffff, static_cast<int32_t>(0xff800000), 0x7f7fffff},
                                             torch::kInt32, torch::kFloat32).reshape({2, 4}));
  std::vector<int16_t> half_bits = {0x7e01, 0x7c01, static_cast<int16_t>(0x8000), 0x0001, 0x03ff, static_cast<int16_t>(0x8001), 0x7bff, 0x7c00};
  out.emplace_back("f16", from_bits<int16_t>(half_bits, torch::kInt16, torch::kFloat16));
  std::vector<int16_t> bf16_bits = {0x7fc1, 0x7f81, static_cast<int16_t>(0x8000), 0x0001, 0x007f, static_cast<int16_t>(0xff80), 0x7f7f, 0x3f80};
  out.emplace_back("bf16", from_bits<int16_t>(bf16_bits, torch::kInt16, torch::kBFloat16).reshape({2, 2, 2}));
  out.emplace_back("i64", torch::tensor(std::vector<int64_t>{INT64_MIN, -1, 0, INT64_MAX}, torch::kInt64));
  out.emplace_back("i32", torch::tensor(std::vector<int32_t>{INT32_MIN, -1, 0, INT32_MAX}, torch::kInt32));
  out.emplace_back("i16", torch::tensor(std::vector<int16_t>{INT16_MIN, -1, 0, INT16_MAX}, torch::kInt16));
  out.emplace_back("i8", torch::tensor(std::vector<int8_t>{INT8_MIN, -1, 0, INT8_MAX}, torch::kInt8));
  out.emplace_back("u8", torch::arange(256, torch::kInt32).to(torch::kUInt8).reshape({16, 16}));
  out.emplace_back("bool", torch::tensor(std::vector<uint8_t>{1, 0, 0, 1, 1}, torch::kUInt8).to(torch::kBool));
  out.emplace_back("f8_e4m3", torch::arange(256, torch::kInt32).to(torch::kUInt8).view(torch::kFloat8_e4m3fn));
  out.emplace_back("f8_e5m2", torch::arange(256, torch::kInt32).to(torch::kUInt8).view(torch::kFloat8_e5m2));
  out.emplace_back("scalar", torch::tensor(-0.0f).reshape({}));
  out.emplace_back("empty", torch::empty({0, 3}, torch::kFloat32));
  return out;
}

}  // namespace amplab::test
