// The convolution part's photograph and filters (photo.hpp).
#include "photo.hpp"

#include <torch/torch.h>

#include <iostream>

#include "images.hpp"
#include "cuda_kernels.hpp"

namespace cuda_kernels {

torch::Tensor filter_named(const std::string& name) {
  if (name == "blur3") return torch::tensor({1.f, 2.f, 1.f, 2.f, 4.f, 2.f, 1.f, 2.f, 1.f}).view({3, 3}) / 16;  // Gaussian
  if (name == "sharpen3") return torch::tensor({0.f, -1.f, 0.f, -1.f, 5.f, -1.f, 0.f, -1.f, 0.f}).view({3, 3});
  if (name == "edge3") return torch::tensor({-1.f, -1.f, -1.f, -1.f, 8.f, -1.f, -1.f, -1.f, -1.f}).view({3, 3});  // Laplacian
  auto binomial = torch::tensor({1.f, 4.f, 6.f, 4.f, 1.f});
  if (name == "blur5") return torch::outer(binomial, binomial) / 256;  // Gaussian, 5x5
  // edge5: Laplacian of Gaussian
  return torch::tensor({0.f, 0.f, -1.f, 0.f, 0.f, 0.f, -1.f, -2.f, -1.f, 0.f, -1.f, -2.f, 16.f, -2.f, -1.f,
                        0.f, -1.f, -2.f, -1.f, 0.f, 0.f, 0.f, -1.f, 0.f, 0.f})
      .view({5, 5});
}

std::pair<torch::Tensor, std::string> filter_photo(const ConvolutionConfig& conv, const amplab::RunDir& run, torch::Device device) {
  torch::Tensor photo = cuda_kernels::load_grey_image(conv.image, run.file("photo.f32"));
  if (!photo.defined()) {
    std::cout << "(could not read " << (conv.image.empty() ? "matplotlib's grace_hopper.jpg" : conv.image)
              << " with scripts/images.py: filtering a test pattern instead)\n";
    auto y = torch::linspace(0, 1, 600).view({-1, 1}), x = torch::linspace(0, 1, 512).view({1, -1});
    photo = (torch::sin(40 * x * y) * 0.5 + 0.5).contiguous();
  }
  photo = photo.to(device);
  std::vector<std::pair<std::string, torch::Tensor>> images = {{run.file("photo"), photo}};
  bool naive_used = false;
  for (const auto& name : conv.filters) {
    torch::Tensor filter = filter_named(name).to(device), out;
    try {
      out = conv2d(photo, filter, ConvVersion::tiled);
    } catch (const amplab::NotImplemented&) {
      out = conv2d(photo, filter, ConvVersion::naive);
      naive_used = true;
    }
    images.emplace_back(run.file("conv_" + name), out);
  }
  if (!cuda_kernels::write_grey_pngs(images, run.file("conv_filters.png")))
    std::cout << "(PNG images skipped: scripts/images.py failed; is matplotlib installed?)\n";
  return {photo, std::string(naive_used ? "(the images used the given naive kernel: TODO(cuda_kernels-8) is still empty)\n" : "") +
                     "images: " + run.file("conv_filters.png") + " and conv_<filter>.png\n"};
}

}  // namespace cuda_kernels
