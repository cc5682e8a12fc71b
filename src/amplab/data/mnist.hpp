// MNIST and Fashion-MNIST: finding the files, loading them into tensors, normalising.
#pragma once

#include <torch/types.h>

#include <string>
#include <vector>

#include "amplab/infra/config.hpp"
#include "amplab/infra/paths.hpp"

namespace amplab {

struct DataConfig {
  std::string dataset = "fashion-mnist";
  // Empty: find_dataset_dir (below) searches for the four IDX files.
  std::string dir = "";
  int64_t train_limit = 0;
  int64_t test_limit = 0;

  template <class V>
  void fields(V& v) {
    v.choice("dataset", dataset, {"fashion-mnist", "mnist"}, "which dataset");
    v.field("dir", dir, "directory holding the IDX files (empty: $FASHION_MNIST_DIR/$MNIST_DIR when set, else data/, /usr/share/datasets)",
            check_path_value);
    v.field("train_limit", train_limit, "use only the first N training images (0: all)", Range<int64_t>::at_least(0));
    v.field("test_limit", test_limit, "use only the first N test images (0: all)", Range<int64_t>::at_least(0));
  }
};

struct MnistSplit {
  torch::Tensor images;  // (N, 28, 28) uint8
  torch::Tensor labels;  // (N) int64, 0..9
  int64_t size() const { return labels.size(0); }
};

struct MnistData {
  MnistSplit train;
  MnistSplit test;
  std::string dir;  // where the files were found
};

// Search order: data.dir, then $FASHION_MNIST_DIR (fashion-mnist) or $MNIST_DIR (mnist), then
// data/<dataset>/ under the current directory and the project root, then (fashion-mnist only)
// /usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist). The error lists every
// place tried and how to get the data.
std::string find_dataset_dir(const DataConfig& config);
std::vector<std::string> dataset_search_path(const DataConfig& config);

// Loads both splits (files named {train,t10k}-{images-idx3,labels-idx1}-ubyte, .gz or not) and
// checks them against each other: 28x28 images, as many labels as images, labels 0..9.
MnistData load_mnist(const DataConfig& config);
MnistSplit load_mnist_split(const std::string& dir, const std::string& split /* "train" or "t10k" */);

// The usual normalisation of pytorch/examples' MNIST: x / 255, then (x - 0.1307) / 0.3081.
constexpr double kMnistMean = 0.1307;
constexpr double kMnistStd = 0.3081;
// (N, 28, 28) uint8 -> (N, 1, 28, 28) float32, normalised, on the images' device.
torch::Tensor normalize_images(const torch::Tensor& images_u8);

}  // namespace amplab
