// Numeric precision of a run: one validated switch, and the guards that apply it.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <span>
#include <utility>

namespace amplab {

enum class Precision {
  fp32,        // plain float32 everywhere
  tf32,        // float32 tensors, TF32 tensor-core matmuls and convolutions (GPU only)
  fp16_mixed,  // autocast to float16 + loss scaling (GradScaler)
  bf16_mixed,  // autocast to bfloat16, no loss scaling needed
};
inline constexpr std::pair<Precision, const char*> kPrecisionNames[] = {
    {Precision::fp32, "fp32"},
    {Precision::tf32, "tf32"},
    {Precision::fp16_mixed, "fp16-mixed"},
    {Precision::bf16_mixed, "bf16-mixed"}};
inline std::span<const std::pair<Precision, const char*>> enum_names(Precision) { return kPrecisionNames; }

}  // namespace amplab
