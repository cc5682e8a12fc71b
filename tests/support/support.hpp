// Test helpers: temporary directories, tensor comparison that reports the first mismatch,
// error-message matching, and skipping GPU tests where there is no GPU.
#pragma once

#include <gtest/gtest.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace amplab::test {

// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string write(const std::string& name, const std::string& content) const;  // returns the path

 private:
  std::filesystem::path path_;
};

// Sizes, dtypes and NaN positions must agree; then values must agree within atol + rtol * |expected|
// (after upcasting fp16/bf16 to fp32). On failure: the index, expected and actual of the first
// mismatch, and the largest error.
// In a graded run each of these three is a check judged outside the student's process (judged.hpp).
::testing::AssertionResult tensors_close(const torch::Tensor& actual, const torch::Tensor& expected,
                                         double rtol, double atol, const char* file = __builtin_FILE(),
                                         int line = __builtin_LINE());
// Bit for bit: same dtype, shape and bytes.
::testing::AssertionResult tensors_equal(const torch::Tensor& actual, const torch::Tensor& expected,
                                         const char* file = __builtin_FILE(), int line = __builtin_LINE());

// The same two checks with the expected side given as a function, called after the actual side is
// computed and only where it is compared: in a plain run and in the judge's, never in the process
// that runs a graded student's code (the judge compares the student's actual side against its own
// expected side). Write the expected side this way whenever it is the answer computed another way:
//   EXPECT_TRUE(tensors_close(ck::matmul(a, b, version), [&] { return torch::mm(a, b); }, 1e-4, 1e-4));
// With the expected side computed first (g++ evaluates a call's arguments last to first), torch::mm's
// result would lie in the CUDA allocator's blocks while the student's matmul runs, and a kernel that
// looks for it there could copy it and compute nothing.
using Expected = std::function<torch::Tensor()>;
::testing::AssertionResult tensors_close(const torch::Tensor& actual, const Expected& expected, double rtol,
                                         double atol, const char* file = __builtin_FILE(),
                                         int line = __builtin_LINE());
::testing::AssertionResult tensors_equal(const torch::Tensor& actual, const Expected& expected,
                                         const char* file = __builtin_FILE(), int line = __builtin_LINE());

// Runs `fn` and checks that it throws std::exception whose message contains every one of `parts`.
::testing::AssertionResult throws_with(const std::function<void()>& fn, std::initializer_list<std::string> parts,
                                       const char* file = __builtin_FILE(), int line = __builtin_LINE());

namespace detail {  // the comparisons themselves, in whichever process runs them
::testing::AssertionResult tensors_close(const torch::Tensor& actual, const torch::Tensor& expected, double rtol,
                                         double atol);
::testing::AssertionResult tensors_equal(const torch::Tensor& actual, const torch::Tensor& expected);
}  // namespace detail

// Exact bytes of CPU tensors, unlike RSS: while one of these lives, torch's CPU allocator is
// wrapped by a counter of the bytes allocated through it (current and peak). Tensors allocated
// before it existed are not counted; their frees are not either. One at a time.
class CpuAllocationCounter {
 public:
  CpuAllocationCounter();   // installs the counter (and zeroes it)
  ~CpuAllocationCounter();  // puts torch's allocator back
  CpuAllocationCounter(const CpuAllocationCounter&) = delete;
  CpuAllocationCounter& operator=(const CpuAllocationCounter&) = delete;
  int64_t current() const;  // bytes allocated and not yet freed
  int64_t peak() const;     // the most bytes at once since construction or reset_peak()
  void reset_peak();        // peak = current
  // A memory limit: an allocation that would take the current bytes past it throws the
  // allocator's c10::OutOfMemoryError, as a full GPU does (0: no limit).
  void set_limit(int64_t bytes);
};

// `depth` transformer-style MLP blocks, x + fc2(dropout(gelu(fc1(layer_norm(x))))) with fc1
// widening 4x, in a Sequential: the deep stack whose activations checkpointing is for.
torch::nn::Sequential residual_mlp_blocks(int64_t depth, int64_t width, double dropout);

// The project root and the build directory (set by CMake in the test environment).
std::string source_dir();

// A JSON fixture of tests/fixtures (written by the PyTorch scripts next to it), and a float32
// tensor stored there as {"shape": [...], "bits": [IEEE-754 bit patterns]}.
nlohmann::json load_fixture(const std::string& name);
torch::Tensor tensor_from_bits(const nlohmann::json& stored);
std::string binary_dir();

// A partial speed test's share of its points from `ratio`, your time over the reference's: all of
// them within `full_within` (1.1: 10% slower), none at `none_at` (twice the time), in proportion
// between. Records speed_ratio and points_fraction (what scripts/grade reads) and prints
// `measured` with the share. Returns the share.
double record_time_ratio_points(double ratio, const std::string& measured, double full_within = 1.1,
                                double none_at = 2.0);

// ---- Speed graded from outside the student's process ----------------------------------------------
// A speed test's rubric entry has a `speed:` rule. In a plain run (ctest) the test times the code
// in its own process, against a baseline, and prints the share of the points that would give.
// When scripts/grade grades it, no time the student's process measures counts: the grader sets
// AMPLAB_SPEED_CALLS, the test makes the calls below and nothing else after its checks, and the
// grader times whole processes from outside: the student's, this checkout's test binary making
// the same calls with the reference's code, and that binary making none (what is not the calls).
//
// Each call gets inputs no earlier call saw (`prepare` writes fresh values into them), so no call
// can reuse another's answer; each call's outputs are folded into one number (a fixed random
// weighting of every element), and the numbers of all calls must be the reference's: a check the
// judge decides, as every tensor check, so calls that skip work are calls that fail.
struct SpeedCalls {
  int calls = 0;                                           // how many: ~5 s of the reference's
  std::function<void(int call)> prepare;                   // fresh inputs for call `call` (the test's own work)
  std::function<std::vector<torch::Tensor>()> call;        // the code whose speed is graded; its outputs
  double rtol = 1e-4;                                      // how close each call's number must be
};
// With AMPLAB_SPEED_CALLS=calls: one warm-up call, then the calls, then the check; true (the test
// ends there). With AMPLAB_SPEED_CALLS=prepare (the grader's run of this checkout's binary, to time
// everything but the calls): the same without the calls and without the check; true. Otherwise
// (a plain run) false: the test times the code itself.
bool make_speed_calls_for_the_grader(const SpeedCalls& speed, const char* file = __builtin_FILE(),
                                     int line = __builtin_LINE());

// The summary.json of the one lab run under `out_dir` (run.out_dir): out_dir/<lab>/<stamp>/summary.json
// only, never a file of that name deeper down (a checkpoint directory the lab's code writes into
// lies inside the run's). Null, with a failure naming out_dir, when there is none.
nlohmann::json lab_run_summary(const std::string& out_dir);

// The reference's time and yours for a partial speed test: each measured `rounds` times, taking
// turns (the reference first), each side's fastest kept, since one machine's step time can move
// by more than the 10% the points allow between two runs a minute apart. Each measure gets its
// round and returns a time, or 0 after reporting a failure, which ends the rounds.
struct TimesOfTurns {
  double reference = 0, mine = 0;
};
TimesOfTurns fastest_of_turns(const std::function<double(int round)>& reference,
                              const std::function<double(int round)>& mine, int rounds = 2);

// The lab binary built from the same variant as this graded test binary ("mnist", "ddp-starter"):
// defined per binary by tests/labs/CMakeLists.txt, which makes AMPLAB_LAB_BINARY call it.
const char* lab_binary();

}  // namespace amplab::test

// Skips the current test when no CUDA device is visible (CI); runs it on the GPU machine.
#define AMPLAB_REQUIRE_CUDA()                                           \
  do {                                                                  \
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

#include "judged.hpp"  // last: it wraps gtest's comparison macros
