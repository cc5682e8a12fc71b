// MNIST and Fashion-MNIST (mnist.hpp): the search for the files, loading a split, normalising.
#include "amplab/data/mnist.hpp"

#include <cstdlib>
#include <filesystem>

#include "amplab/data/idx.hpp"
#include "amplab/infra/env.hpp"
#include "amplab/infra/error.hpp"

namespace amplab {

namespace fs = std::filesystem;

namespace {

const char* kDebianFashionDir = "/usr/share/datasets/fashion-mnist";

// The file for `stem` in `dir`, gzip-compressed or not; "" when neither exists. Whatever the
// name holds (a FIFO, a dangling link) is taken: reading it then says what is wrong with it.
std::string find_file(const std::string& dir, const std::string& stem) {
  for (const char* suffix : {".gz", ""}) {
    fs::path p = fs::path(dir) / (stem + suffix);
    std::error_code ec;
    if (fs::exists(fs::symlink_status(p, ec)) && !fs::is_directory(p, ec)) return p.string();
  }
  return "";
}

bool has_dataset(const std::string& dir) {
  for (const char* stem : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                           "t10k-labels-idx1-ubyte"})
    if (find_file(dir, stem).empty()) return false;
  return true;
}

}  // namespace

std::vector<std::string> dataset_search_path(const DataConfig& config) {
  std::vector<std::string> dirs;
  // An explicit directory (the key, else the variable) is the only place looked at: used, or
  // refused with what is wrong in it, never skipped in favour of another copy.
  if (!config.dir.empty()) return {config.dir};
  const char* env_name = config.dataset == "mnist" ? "MNIST_DIR" : "FASHION_MNIST_DIR";
  if (const char* env = std::getenv(env_name); env && *env) return {env};
  dirs.push_back((fs::path("data") / config.dataset).string());
  dirs.push_back((fs::path(source_dir()) / "data" / config.dataset).string());
  if (config.dataset == "fashion-mnist") dirs.push_back(kDebianFashionDir);
  return dirs;
}

std::string find_dataset_dir(const DataConfig& config) {
  auto dirs = dataset_search_path(config);
  for (const auto& dir : dirs)
    if (has_dataset(dir)) return dir;
  std::string tried;
  for (const auto& dir : dirs) tried += (tried.empty() ? "" : ", ") + dir;
  const char* env_name = config.dataset == "mnist" ? "MNIST_DIR" : "FASHION_MNIST_DIR";
  if (config.dir.empty() && dirs.size() == 1)
    throw Error(std::string("$") + env_name + "='" + dirs[0] + "' holds no " + config.dataset +
                " files ({train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]); fix it, or unset it to search data/ and "
                "the system's copy");
  std::string how = config.dataset == "mnist"
                        ? "run scripts/fetch-mnist.sh (needs internet) or set data.dir / $MNIST_DIR"
                        : "install Debian's dataset-fashion-mnist (scripts/setup.sh does) or set data.dir / $FASHION_MNIST_DIR";
  throw Error("data.dir: no " + config.dataset +
              " files ({train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]) found; tried: " + tried + "; " + how);
}

MnistSplit load_mnist_split(const std::string& dir, const std::string& split) {
  std::string images_path = find_file(dir, split + "-images-idx3-ubyte");
  std::string labels_path = find_file(dir, split + "-labels-idx1-ubyte");
  if (images_path.empty()) throw Error(dir + ": no " + split + "-images-idx3-ubyte[.gz]");
  if (labels_path.empty()) throw Error(dir + ": no " + split + "-labels-idx1-ubyte[.gz]");
  IdxArray images = read_idx(images_path);
  IdxArray labels = read_idx(labels_path);
  if (images.dims.size() != 3 || images.dims[1] != 28 || images.dims[2] != 28) {
    std::string shape;
    for (size_t i = 0; i < images.dims.size(); ++i) shape += (i ? ", " : "") + std::to_string(images.dims[i]);
    throw Error(images_path + ": expected images of shape (N, 28, 28), got (" + shape + "); is this an MNIST-format file?");
  }
  if (labels.dims.size() != 1) throw Error(labels_path + ": expected a 1-dimensional array of labels");
  if (labels.dims[0] != images.dims[0])
    throw Error(labels_path + ": " + std::to_string(labels.dims[0]) + " labels for " + std::to_string(images.dims[0]) +
                " images in " + images_path);
  for (size_t i = 0; i < labels.data.size(); ++i)
    if (labels.data[i] > 9)
      throw Error(labels_path + ": label " + std::to_string(labels.data[i]) + " at index " + std::to_string(i) +
                  " is outside 0..9");
  MnistSplit out;
  out.images = torch::from_blob(images.data.data(), images.dims, torch::kUInt8).clone();
  out.labels = torch::from_blob(labels.data.data(), labels.dims, torch::kUInt8).to(torch::kInt64);
  return out;
}

MnistData load_mnist(const DataConfig& config) {
  MnistData data;
  data.dir = find_dataset_dir(config);
  data.train = load_mnist_split(data.dir, "train");
  data.test = load_mnist_split(data.dir, "t10k");
  auto limit = [](MnistSplit& split, int64_t n) {
    if (n > 0 && n < split.size()) {
      split.images = split.images.narrow(0, 0, n).clone();
      split.labels = split.labels.narrow(0, 0, n).clone();
    }
  };
  limit(data.train, config.train_limit);
  limit(data.test, config.test_limit);
  return data;
}

torch::Tensor normalize_images(const torch::Tensor& images_u8) {
  return images_u8.unsqueeze(1).to(torch::kFloat32).div_(255.0).sub_(kMnistMean).div_(kMnistStd);
}

}  // namespace amplab
