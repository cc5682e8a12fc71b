#include "support.hpp"

#include <c10/util/Exception.h>

#include <torch/torch.h>
#include <ATen/CPUGeneratorImpl.h>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <ftw.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <iostream>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

namespace amplab::test {

namespace {

// A CPU allocator that counts: each block carries its size in a 64-byte header in front of the
// data (which stays 64-byte aligned), so the deleter knows what it frees. It keeps the data
// pointer as the context, as torch's raw_allocate() requires. Never destroyed: tensors it
// allocated may be freed after the counter object is gone.
class CountingAllocator final : public c10::Allocator {
 public:
  static constexpr size_t kHeader = 64;  // bytes; c10's alignment
  std::atomic<int64_t> current{0}, peak{0};
  std::atomic<int64_t> limit{0};         // bytes; an allocation past it throws (0: none)
  c10::Allocator* previous = nullptr;    // put back by ~CpuAllocationCounter

  c10::DataPtr allocate(size_t bytes) override {
    const int64_t cap = limit.load();
    if (cap > 0 && current.load() + static_cast<int64_t>(bytes) > cap)
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU out of memory (test limit). Tried to allocate ", bytes,
                       " bytes with ", current.load(), " of ", cap, " in use");
    auto* base = static_cast<char*>(c10::alloc_cpu(bytes + kHeader));
    *reinterpret_cast<size_t*>(base) = bytes;
    const auto n = static_cast<int64_t>(bytes);
    int64_t now = instance().current.fetch_add(n) + n;
    int64_t seen = instance().peak.load();
    while (now > seen && !instance().peak.compare_exchange_weak(seen, now)) {
    }
    void* data = base + kHeader;
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  static CountingAllocator& instance() {
    static auto* allocator = new CountingAllocator();
    return *allocator;
  }

 private:
  static void release(void* data) {
    if (data == nullptr) return;
    char* base = static_cast<char*>(data) - kHeader;
    instance().current.fetch_sub(static_cast<int64_t>(*reinterpret_cast<size_t*>(base)));
    c10::free_cpu(base);
  }
};

CountingAllocator& counting_allocator() { return CountingAllocator::instance(); }

// Above the default allocator's priority (0), so that SetCPUAllocator takes it and, on the way
// back, takes the original again.
constexpr uint8_t kCounterPriority = 100;

}  // namespace

CpuAllocationCounter::CpuAllocationCounter() {
  auto& counter = counting_allocator();
  if (c10::GetCPUAllocator() == &counter) throw std::runtime_error("CpuAllocationCounter: one is already installed");
  counter.previous = c10::GetCPUAllocator();
  counter.current = 0;
  counter.peak = 0;
  counter.limit = 0;
  c10::SetCPUAllocator(&counter, kCounterPriority);
}

CpuAllocationCounter::~CpuAllocationCounter() {
  counting_allocator().limit = 0;
  c10::SetCPUAllocator(counting_allocator().previous, kCounterPriority);
}

void CpuAllocationCounter::set_limit(int64_t bytes) { counting_allocator().limit = bytes; }

int64_t CpuAllocationCounter::current() const { return counting_allocator().current.load(); }
int64_t CpuAllocationCounter::peak() const { return counting_allocator().peak.load(); }
void CpuAllocationCounter::reset_peak() { counting_allocator().peak = counting_allocator().current.load(); }

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

double record_time_ratio_points(double ratio, const std::string& measured, double full_within, double none_at) {
  const double fraction = std::clamp((none_at - ratio) / (none_at - full_within), 0.0, 1.0);
  ::testing::Test::RecordProperty("speed_ratio", std::to_string(ratio));
  ::testing::Test::RecordProperty("points_fraction", std::to_string(fraction));
  std::cout << measured << ": " << ratio << "x its time, " << std::lround(100 * fraction) << "% of the points\n";
  return fraction;
}

nlohmann::json lab_run_summary(const std::string& out_dir) {
  std::error_code error;
  for (const auto& lab : std::filesystem::directory_iterator(out_dir, error))
    for (const auto& run : std::filesystem::directory_iterator(lab.path(), error)) {
      const auto path = run.path() / "summary.json";
      if (std::filesystem::is_regular_file(path)) return nlohmann::json::parse(std::ifstream(path));
    }
  ADD_FAILURE() << "no <lab>/<stamp>/summary.json under " << out_dir;
  return {};
}

TimesOfTurns fastest_of_turns(const std::function<double(int round)>& reference,
                              const std::function<double(int round)>& mine, int rounds) {
  TimesOfTurns best;
  for (int round = 0; round < rounds; ++round) {
    const double r = reference(round);
    const double m = r > 0 ? mine(round) : 0;
    if (r <= 0 || m <= 0) break;
    best.reference = round == 0 ? r : std::min(best.reference, r);
    best.mine = round == 0 ? m : std::min(best.mine, m);
  }
  return best;
}

bool make_speed_calls_for_the_grader(const SpeedCalls& speed, const char* file, int line) {
  const char* mode = std::getenv("AMPLAB_SPEED_CALLS");
  if (mode == nullptr) return false;
  const bool calls = std::string(mode) == "calls";
  if (!calls && std::string(mode) != "prepare") {
    ADD_FAILURE() << "AMPLAB_SPEED_CALLS=" << mode << ": 'calls' or 'prepare' (scripts/grade sets it)";
    return true;
  }
  // The warm-up call, in every run: its outputs give each output's weights and the size of a
  // call's number, and the prepare-only run folds them again at each call, so that all three runs
  // do the same work but the calls.
  if (speed.prepare) speed.prepare(-1);
  std::vector<torch::Tensor> outputs = speed.call();
  std::vector<torch::Tensor> weights;
  torch::Tensor scale = torch::zeros({}, torch::kFloat64);
  for (const auto& out : outputs) {
    auto generator = at::detail::createCPUGenerator(static_cast<uint64_t>(out.numel()) + weights.size());
    weights.push_back(at::rand({out.numel()}, generator, torch::kFloat32).to(out.device()) + 0.5);
    scale += (out.detach().flatten().to(torch::kFloat32) * weights.back()).norm().to(torch::kCPU, torch::kFloat64);
  }
  auto fold = [&](const std::vector<torch::Tensor>& outs) {
    torch::Tensor sum = torch::dot(outs.at(0).detach().flatten().to(torch::kFloat32), weights.at(0));
    for (size_t i = 1; i < outs.size(); ++i) sum += torch::dot(outs[i].detach().flatten().to(torch::kFloat32), weights.at(i));
    return sum;
  };
  torch::Tensor numbers = torch::empty({speed.calls}, outputs.at(0).options().dtype(torch::kFloat32));
  for (int i = 0; i < speed.calls; ++i) {
    if (speed.prepare) speed.prepare(i);
    if (calls) outputs = speed.call();
    numbers[i].copy_(fold(outputs));
  }
  numbers = numbers.to(torch::kCPU, torch::kFloat64);  // waits for the last call
  if (calls) {
    const double atol = speed.rtol * scale.item<double>();
    EXPECT_TRUE(tensors_close(numbers, numbers, speed.rtol, atol, file, line))
        << "(each call's outputs, folded into one number: in the judge's run the second operand is the reference's)";
  }
  return true;
}

namespace detail {

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

}  // namespace detail

::testing::AssertionResult tensors_close(const torch::Tensor& actual, const torch::Tensor& expected, double rtol,
                                         double atol, const char* file, int line) {
  auto own = detail::tensors_close(actual, expected, rtol, atol);
  if (judged::role() == judged::Role::plain) return own;
  return judged::observe(judged::Kind::tensors_close, file, line,
                         {judged::tensor_operand(actual), judged::tensor_operand(expected)}, own, atol, rtol);
}

::testing::AssertionResult tensors_equal(const torch::Tensor& actual, const torch::Tensor& expected, const char* file,
                                         int line) {
  auto own = detail::tensors_equal(actual, expected);
  if (judged::role() == judged::Role::plain) return own;
  return judged::observe(judged::Kind::tensors_equal, file, line,
                         {judged::tensor_operand(actual), judged::tensor_operand(expected)}, own);
}

namespace {
judged::Operand withheld() {
  judged::Operand operand;
  operand.tag = judged::Operand::Tag::withheld;
  return operand;
}
}  // namespace

::testing::AssertionResult tensors_close(const torch::Tensor& actual, const Expected& expected, double rtol,
                                         double atol, const char* file, int line) {
  if (!judged::computes_expected())
    return judged::observe(judged::Kind::tensors_close, file, line, {judged::tensor_operand(actual), withheld()},
                           ::testing::AssertionSuccess(), atol, rtol, /*expected_as_function=*/true);
  const torch::Tensor want = expected();
  auto own = detail::tensors_close(actual, want, rtol, atol);
  if (judged::role() == judged::Role::plain) return own;
  return judged::observe(judged::Kind::tensors_close, file, line,
                         {judged::tensor_operand(actual), judged::tensor_operand(want)}, own, atol, rtol, true);
}

::testing::AssertionResult tensors_equal(const torch::Tensor& actual, const Expected& expected, const char* file,
                                         int line) {
  if (!judged::computes_expected())
    return judged::observe(judged::Kind::tensors_equal, file, line, {judged::tensor_operand(actual), withheld()},
                           ::testing::AssertionSuccess(), 0, 0, /*expected_as_function=*/true);
  const torch::Tensor want = expected();
  auto own = detail::tensors_equal(actual, want);
  if (judged::role() == judged::Role::plain) return own;
  return judged::observe(judged::Kind::tensors_equal, file, line,
                         {judged::tensor_operand(actual), judged::tensor_operand(want)}, own, 0, 0, true);
}

::testing::AssertionResult throws_with(const std::function<void()>& fn, std::initializer_list<std::string> parts,
                                       const char* file, int line) {
  std::string expected;  // the parts, one a line: the observation's second operand
  for (const auto& part : parts) expected += part + "\n";
  judged::Operand thrown;  // the message, or the number 0: it did not throw
  thrown.tag = judged::Operand::Tag::integer;
  ::testing::AssertionResult own = ::testing::AssertionFailure() << "did not throw";
  try {
    fn();
  } catch (const std::exception& e) {
    std::string message = e.what();
    thrown = judged::operand(message);
    own = ::testing::AssertionSuccess() << message;
    for (const auto& part : parts)
      if (message.find(part) == std::string::npos) {
        own = ::testing::AssertionFailure() << "message lacks \"" << part << "\": " << message;
        break;
      }
  }
  if (judged::role() == judged::Role::plain) return own;
  return judged::observe(judged::Kind::throws, file, line, {thrown, judged::operand(expected)}, own);
}

std::string source_dir() {
  const char* dir = std::getenv("AMPLAB_SOURCE_DIR");
  return dir ? dir : AMPLAB_SOURCE_DIR;
}

nlohmann::json load_fixture(const std::string& name) {
  std::ifstream in(source_dir() + "/tests/fixtures/" + name);
  if (!in) throw std::runtime_error("missing tests/fixtures/" + name);
  return nlohmann::json::parse(in);
}

torch::Tensor tensor_from_bits(const nlohmann::json& stored) {
  std::vector<int64_t> shape = stored.at("shape").get<std::vector<int64_t>>();
  std::vector<uint32_t> bits = stored.at("bits").get<std::vector<uint32_t>>();
  std::vector<float> values(bits.size());
  std::memcpy(values.data(), bits.data(), bits.size() * sizeof(float));
  return torch::from_blob(values.data(), shape, torch::kFloat32).clone();
}

std::string binary_dir() {
  const char* dir = std::getenv("AMPLAB_BINARY_DIR");
  return dir ? dir : AMPLAB_TEST_BINARY_DIR;
}

namespace {
struct ResidualMlpBlockImpl : torch::nn::Module {
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout dropout{nullptr};
  ResidualMlpBlockImpl(int64_t width, double p) {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
    fc1 = register_module("fc1", torch::nn::Linear(width, 4 * width));
    fc2 = register_module("fc2", torch::nn::Linear(4 * width, width));
    dropout = register_module("dropout", torch::nn::Dropout(p));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x + fc2(dropout(torch::gelu(fc1(norm(x))))); }
};
TORCH_MODULE(ResidualMlpBlock);
}  // namespace

torch::nn::Sequential residual_mlp_blocks(int64_t depth, int64_t width, double dropout) {
  torch::nn::Sequential seq;
  for (int64_t i = 0; i < depth; ++i) seq->push_back(ResidualMlpBlock(width, dropout));
  return seq;
}

}  // namespace amplab::test
