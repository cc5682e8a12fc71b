// The dtype census (given, no TODOs): the dtype of every tensor of one small step under autocast,
// measured rather than told, so that the hand-out's question 9 can set a prediction beside it.
// The model is a Linear, a ReLU, a LayerNorm and a Linear, trained with cross-entropy: one op of
// each kind autocast treats differently (cast to 16 bits, left in its input's dtype, kept in fp32
// on some devices and not on others, a loss).
#pragma once

#include <torch/types.h>

#include <string>
#include <vector>

#include "amplab/train/precision.hpp"

namespace amp_training {

struct CensusEntry {
  std::string tensor;  // "fc1(x)", "loss", "fc1.weight.grad", ...
  c10::ScalarType dtype;
};

// One forward under autocast in `precision` on `device` (fp32 and tf32: no autocast), the loss,
// and backward outside the guard, as the lab's train_step does; the tensors in the order they
// are made. Throws amplab::Error when the precision cannot run on the device.
std::vector<CensusEntry> autocast_dtype_census(torch::Device device, amplab::Precision precision);

// "float32", "bfloat16", "float16": PyTorch's names, as torch.float32 prints.
std::string dtype_name(c10::ScalarType dtype);

}  // namespace amp_training
