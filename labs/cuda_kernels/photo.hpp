// The convolution part's photograph and filters, given (no TODOs).
#pragma once

#include <torch/types.h>

#include <string>
#include <utility>

#include "amplab/report/run_dir.hpp"
#include "config.hpp"

namespace cuda_kernels {

// The 3x3 and 5x5 filters of convolution.filters: blur3, sharpen3, edge3, blur5, edge5.
torch::Tensor filter_named(const std::string& name);

// The photograph (a test pattern if it cannot be read) through each filter (the tiled kernel; the given
// naive one while TODO 8 is empty) into conv_filters.png; returns the photograph on the device and the
// footer of the part's table.
std::pair<torch::Tensor, std::string> filter_photo(const ConvolutionConfig& conv, const amplab::RunDir& run, torch::Device device);

}  // namespace cuda_kernels
