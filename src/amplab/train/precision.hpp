// Numeric precision of a run: one validated switch, and the RAII guards that apply it.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <span>
#include <string>
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
std::string to_string(Precision precision);

inline bool is_mixed(Precision p) { return p == Precision::fp16_mixed || p == Precision::bf16_mixed; }
// Only fp16 has a range narrow enough to need loss scaling.
inline bool needs_loss_scaling(Precision p) { return p == Precision::fp16_mixed; }
// The lower-precision dtype autocast uses (Half or BFloat16); Float for fp32/tf32.
c10::ScalarType autocast_dtype(Precision precision);

// Throws amplab::Error when `precision` cannot run on `device`: tf32 and fp16-mixed need a GPU
// (CPU autocast is bf16), bf16-mixed on a GPU needs compute capability 8.0+ (Ampere).
void check_supported(Precision precision, c10::Device device);
// Same question without throwing; `why` gets the reason when false.
bool is_supported(Precision precision, c10::Device device, std::string* why = nullptr);

// torch.autocast in C++. Saves the previous state of `device_type`, sets enabled and dtype,
// increments the nesting count; on exit decrements it, clears the cast cache when nesting reaches
// 0, and restores what was there before. Nested guards therefore compose like Python's.
class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device_type, c10::ScalarType dtype, bool enabled = true, bool cache_enabled = true);
  // Enabled for fp16-mixed/bf16-mixed on device.type(), a no-op guard for fp32/tf32. The cast
  // cache keeps its current setting (on by default; off while a CUDA graph is captured).
  AutocastGuard(c10::Device device, Precision precision);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_type_;
  bool previous_enabled_;
  c10::ScalarType previous_dtype_;
  bool previous_cache_enabled_;
};

// Allows (or forbids) TF32 in cuBLAS matmuls and cuDNN convolutions for its lifetime, then
// restores both flags.
class Tf32Guard {
 public:
  explicit Tf32Guard(bool allow);
  ~Tf32Guard();
  Tf32Guard(const Tf32Guard&) = delete;
  Tf32Guard& operator=(const Tf32Guard&) = delete;

 private:
  bool previous_cublas_;
  bool previous_cudnn_;
};

}  // namespace amplab
