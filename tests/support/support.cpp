#include "support.hpp"

#include <torch/torch.h>

#include <ftw.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

namespace amplab::test {

TempDir::TempDir() {
  std::random_device rd;
  for (;;) {
    auto candidate = std::filesystem::temp_directory_path() / ("amplab-test-" + std::to_string(rd()));
    if (std::filesystem::create_directory(candidate)) {
      path_ = candidate;
      return;
    }
  }
}

TempDir::~TempDir() {
  // POSIX nftw rather than std::filesystem::remove_all: libtorch.so exports an older, incompatible
  // copy of remove_all that crashes when the dynamic linker binds to it (seen with g++ 13).
  nftw(path_.c_str(), [](const char* path, const struct stat*, int, struct FTW*) { return ::remove(path); }, 16,
       FTW_DEPTH | FTW_PHYS);
}

std::string TempDir::write(const std::string& name, const std::string& content) const {
  auto p = path_ / name;
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << content;
  return p.string();
}

::testing::AssertionResult tensors_close(const torch::Tensor& actual, const torch::Tensor& expected, double rtol,
                                         double atol) {
  if (actual.sizes() != expected.sizes()) {
    std::ostringstream out;
    out << "sizes differ: actual " << actual.sizes() << ", expected " << expected.sizes();
    return ::testing::AssertionFailure() << out.str();
  }
  auto a = actual.detach().to(torch::kCPU, torch::kFloat64).contiguous().flatten();
  auto e = expected.detach().to(torch::kCPU, torch::kFloat64).contiguous().flatten();
  auto a_nan = a.isnan(), e_nan = e.isnan();
  if (!a_nan.equal(e_nan)) {
    int64_t i = (a_nan != e_nan).nonzero()[0].item<int64_t>();
    return ::testing::AssertionFailure() << "NaN positions differ, first at flat index " << i << ": actual "
                                         << a[i].item<double>() << ", expected " << e[i].item<double>();
  }
  auto finite = ~e_nan;
  auto error = (a - e).abs().masked_fill(~finite, 0);
  auto bound = atol + rtol * e.abs().masked_fill(~finite, 0);
  auto bad = error > bound;
  if (bad.any().item<bool>()) {
    int64_t i = bad.nonzero()[0].item<int64_t>();
    return ::testing::AssertionFailure()
           << bad.sum().item<int64_t>() << " of " << a.numel() << " values differ; first at flat index " << i
           << ": actual " << a[i].item<double>() << ", expected " << e[i].item<double>()
           << "; largest error " << error.max().item<double>() << " (rtol " << rtol << ", atol " << atol << ")";
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult tensors_equal(const torch::Tensor& actual, const torch::Tensor& expected) {
  if (actual.scalar_type() != expected.scalar_type())
    return ::testing::AssertionFailure() << "dtypes differ: actual " << actual.scalar_type() << ", expected "
                                         << expected.scalar_type();
  if (actual.sizes() != expected.sizes()) {
    std::ostringstream out;
    out << "sizes differ: actual " << actual.sizes() << ", expected " << expected.sizes();
    return ::testing::AssertionFailure() << out.str();
  }
  auto a = actual.detach().cpu().contiguous();
  auto e = expected.detach().cpu().contiguous();
  const auto* pa = static_cast<const uint8_t*>(a.data_ptr());
  const auto* pe = static_cast<const uint8_t*>(e.data_ptr());
  size_t item = a.element_size();
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::memcmp(pa + i * item, pe + i * item, item) != 0) {
      return ::testing::AssertionFailure() << "first bitwise difference at flat index " << i << ": actual "
                                           << a.flatten()[i].item<double>() << ", expected "
                                           << e.flatten()[i].item<double>();
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult throws_with(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const std::exception& e) {
    std::string message = e.what();
    for (const auto& part : parts)
      if (message.find(part) == std::string::npos)
        return ::testing::AssertionFailure() << "message lacks \"" << part << "\": " << message;
    return ::testing::AssertionSuccess() << message;
  }
  return ::testing::AssertionFailure() << "did not throw";
}

std::string source_dir() {
  const char* dir = std::getenv("AMPLAB_SOURCE_DIR");
  return dir ? dir : AMPLAB_SOURCE_DIR;
}

std::string binary_dir() {
  const char* dir = std::getenv("AMPLAB_BINARY_DIR");
  return dir ? dir : AMPLAB_TEST_BINARY_DIR;
}

}  // namespace amplab::test
