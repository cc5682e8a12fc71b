// The app's grey images (lab 6's photograph, its filtered versions) to and from scripts/images.py (matplotlib): a photograph read as a tensor, tensors
// written as PNGs. A missing matplotlib costs the images, never the run.
#pragma once

#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

namespace cuda_kernels {

// The image at `path` ("" for matplotlib's sample photograph grace_hopper.jpg) as a (h, w) float32
// tensor of grey values in [0, 1] on the CPU, passed through the raw file `scratch` (removed
// after). An undefined tensor when scripts/images.py cannot read it.
torch::Tensor load_grey_image(const std::string& path, const std::string& scratch);

// Each (stem, image): <stem>.png, grey values clipped to [0, 1] (stems with "edge" in their name
// show |value| scaled to the 99.5th percentile), and all side by side, titled by their names, in
// `montage`. Each image passes through <stem>.f32, removed after. False when scripts/images.py fails.
bool write_grey_pngs(const std::vector<std::pair<std::string, torch::Tensor>>& images, const std::string& montage);

}  // namespace cuda_kernels
