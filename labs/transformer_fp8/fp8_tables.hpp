// Lab 7, given (no TODOs): the GPU tables of the FP8 part (fp8_mlp.csv, fp8_casts.csv,
// fp8_matmul.csv), which the lab binary prints on a GPU with FP8 (labs/transformer_fp8/README.md).
#pragma once

#include <torch/types.h>

#include <functional>
#include <string>

#include "amplab/report/results.hpp"
#include "gpt.hpp"

namespace transformer_fp8 {

// The FP8 MLP (4 x Linear(8192), batch 8192) against bf16: ms/step, TFLOP/s and the loss after 50
// Adam steps; the casts' GB/s against a copy; one matmul at three shapes in bf16 and FP8. Each
// part starts with phase("fp8 mlp" | "fp8 casts" | "fp8 matmul").
// `other`, when it has a name: one more MLP row, computed by what other.make() returns (a fresh
// one for each MLP the row builds: the timed one, then the one trained for the loss).
struct OtherMlpRow {
  std::string name;
  std::function<SpeedMlp::Forward()> make;
};
void fp8_tables(amplab::Results& results, torch::Device device, const std::function<void(const std::string&)>& phase,
                const OtherMlpRow& other = {});

}  // namespace transformer_fp8
