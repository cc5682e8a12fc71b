// The network's weights in safetensors files, given (no TODOs): mnist.init_weights read in, and each
// mode's trained weights written under the names pytorch/examples' Net has in Python.
#pragma once

#include <string>

#include "amplab/report/run_dir.hpp"
#include "mnist.hpp"

namespace mnist {

// mnist.init_weights into `net` (on any device), or an amplab::Error of one line naming the key,
// the file and what does not fit.
void load_init_weights(Net& net, const std::string& path);

// The trained weights as model-<mode>.safetensors in the run directory, under the names
// pytorch/examples' Net has in Python (bench/eval_safetensors.py evaluates them there), with the
// accuracy this run measured in the metadata. Returns the path.
std::string save_weights(Net& net, const ModeResult& result, const std::string& dataset, int64_t test_images,
                         const amplab::RunDir& run);

}  // namespace mnist
