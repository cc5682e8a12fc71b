// Graded tests of lab 6 (CUDA kernels). Each test names the TODO it grades; every one fails on the
// untouched starter (a launcher's AMPLAB_TODO throws) and passes on a correct solution. Tests named
// *_CUDA need a GPU and are skipped without one; the others check what runs on the host (costs,
// launch configuration, argument checks) and run everywhere.
//
// Kernels are checked against PyTorch (or a float64 sum on the CPU) on sizes that are not multiples
// of the block or tile sizes, empty and one-element inputs, misaligned pointers, fp32 and bf16.
// The *Speed_CUDA tests (rubric: speed) check the result, then time the kernel; they never fail for
// speed. Their points: full at 5/6 of the reference solution's speed, proportionally less below.
// In a plain run they time it here, as a ratio to a PyTorch baseline timed in the same test, held
// against the reference's ratio on an H200 (kReference below). When scripts/grade grades them it
// times the calls itself, from outside the process, against the reference's own calls on the same
// machine (support.hpp's make_speed_calls_for_the_grader).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "amplab/infra/error.hpp"
#include "amplab/train/precision.hpp"
#include "amplab/measure/timing.hpp"
#include "cuda_kernels.hpp"
#include "support.hpp"

namespace {

namespace ck = cuda_kernels;
using amplab::test::tensors_close;
using amplab::test::tensors_equal;

// `fn` throws amplab::Error (not NotImplemented) whose message has every one of `parts`.
::testing::AssertionResult rejects(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const amplab::NotImplemented& e) {
    return ::testing::AssertionFailure() << e.what();
  } catch (const amplab::Error& e) {
    const std::string message = e.what();
    for (const auto& part : parts)
      if (message.find(part) == std::string::npos)
        return ::testing::AssertionFailure() << "the error \"" << message << "\" does not say \"" << part << "\"";
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a std::exception that is not an amplab::Error: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

torch::Device gpu() { return torch::Device(torch::kCUDA, 0); }
torch::TensorOptions on_gpu(torch::ScalarType dtype = torch::kFloat32) {
  return torch::TensorOptions().dtype(dtype).device(gpu());
}

// The median milliseconds of one call of `work` (windows of calls back to back, after a warm-up).
double median_ms(const std::function<void()>& work, int per_window = 10, int windows = 7) {
  for (int i = 0; i < 3; ++i) work();
  return amplab::quantile(amplab::time_back_to_back(work, gpu(), per_window, windows), 0.5);
}

// The reference solution's speed on an H200, as a ratio to the PyTorch baseline of each speed test
// (labs/cuda_kernels/gpu-check.sh prints the ratios it measures: update these from its output).
// Measured 2026-11-23 on an H200 (700 W, 1980 MHz), CUDA 13.0, torch 2.11.0.
struct Reference {
  double float4_vs_copy = 0.975;           // vector add float4's effective GB/s / the device copy's, 100 M floats
  double warp_reduce_vs_torch_sum = 1.12;  // torch.sum's time / reduce_warp_shuffle's, 100 M floats
  double tiled_conv_vs_torch = 14.1;       // torch conv2d's time / conv2d tiled's, 4096 x 4096, 3x3
  double register_blocked_vs_cublas = 0.85;  // cuBLAS fp32 (TF32 off) time / matmul_register_blocked's, 4096^3
  double fused_vs_composed = 1.245;        // composed forward + backward time / the fused op's, 8192 x 8192 bf16
};
constexpr Reference kReference;

// Full points at 5/6 of the reference's ratio, proportionally less below.
void record_speed(double ratio, double reference) {
  const double fraction = std::clamp(ratio / (reference * 5.0 / 6.0), 0.0, 1.0);
  ::testing::Test::RecordProperty("speed_ratio", std::to_string(ratio));
  ::testing::Test::RecordProperty("points_fraction", std::to_string(fraction));
  std::cout << "speed ratio " << ratio << " (reference " << reference << "): " << std::lround(100 * fraction)
            << "% of the points\n";
}

// ---- TODO(cuda_kernels-1): the cost model ---------------------------------------------------------

TEST(Kernels1_Costs, VectorAddAndReduce) {
  auto add = ck::vector_add_cost(1000);
  EXPECT_DOUBLE_EQ(add.flops, 1000);
  EXPECT_DOUBLE_EQ(add.bytes, 12000);  // a, b read; c written; 4 bytes each
  auto sum = ck::reduce_cost(1000);
  EXPECT_DOUBLE_EQ(sum.flops, 999);
  EXPECT_DOUBLE_EQ(sum.bytes, 4004);
  EXPECT_DOUBLE_EQ(ck::reduce_cost(0).flops, 0);
  EXPECT_DOUBLE_EQ(ck::vector_add_cost(0).bytes, 0);
  EXPECT_DOUBLE_EQ(ck::vector_add_cost(100'000'000).bytes, 1.2e9);
}

TEST(Kernels1_Costs, ConvolutionAndMatmul) {
  auto conv = ck::conv2d_cost(4096, 4096, 1);
  EXPECT_DOUBLE_EQ(conv.flops, 2.0 * 9 * 4096 * 4096);
  EXPECT_DOUBLE_EQ(conv.bytes, 4.0 * (2.0 * 4096 * 4096 + 9));
  EXPECT_DOUBLE_EQ(ck::conv2d_cost(10, 20, 2).flops, 2.0 * 25 * 200);
  auto mm = ck::matmul_cost(2, 3, 4, 4);
  EXPECT_DOUBLE_EQ(mm.flops, 48);
  EXPECT_DOUBLE_EQ(mm.bytes, 4.0 * (8 + 12 + 6));
  auto big = ck::matmul_cost(8192, 8192, 8192, 2);  // 2 * 8192^3 overflows nothing in double
  EXPECT_DOUBLE_EQ(big.flops, 2.0 * 8192 * 8192 * 8192);
  EXPECT_DOUBLE_EQ(big.bytes, 2.0 * 3 * 8192 * 8192);
  EXPECT_NEAR(big.intensity(), 8192.0 / 3, 1e-9);
}

TEST(Kernels1_Costs, NegativeSizesAreErrors) {
  EXPECT_TRUE(rejects([] { ck::vector_add_cost(-1); }, {"vector_add_cost", "n = -1"}));
  EXPECT_TRUE(rejects([] { ck::reduce_cost(-5); }, {"reduce_cost", "n = -5"}));
  EXPECT_TRUE(rejects([] { ck::conv2d_cost(4, 4, -1); }, {"conv2d_cost", "radius = -1"}));
  EXPECT_TRUE(rejects([] { ck::matmul_cost(2, 2, -3, 4); }, {"matmul_cost", "k = -3"}));
  EXPECT_TRUE(rejects([] { ck::matmul_cost(2, 2, 2, 0); }, {"matmul_cost", "element_bytes = 0"}));
}

// ---- TODO(cuda_kernels-2): grid-stride vector add --------------------------------------------------

TEST(Kernels2_GridStride, BlocksCoverTheInputUpToOneWave) {
  EXPECT_EQ(ck::grid_stride_blocks(1000, 256, 132, 8), 4);
  EXPECT_EQ(ck::grid_stride_blocks(1024, 256, 132, 8), 4);
  EXPECT_EQ(ck::grid_stride_blocks(1025, 256, 132, 8), 5);
  EXPECT_EQ(ck::grid_stride_blocks(1, 1024, 132, 2), 1);
  EXPECT_EQ(ck::grid_stride_blocks(0, 256, 132, 8), 0);
  EXPECT_EQ(ck::grid_stride_blocks(100'000'000, 256, 132, 8), 132 * 8);  // one wave; the loop does the rest
  EXPECT_EQ(ck::grid_stride_blocks(int64_t{5} << 30, 32, 1, 1), 1);       // past 2^32 items
}

TEST(Kernels2_GridStride, BadArgumentsAreErrorsAndEmptyLaunchesNothing) {
  EXPECT_TRUE(rejects([] { ck::grid_stride_blocks(-1, 256, 132, 8); }, {"grid_stride_blocks", "n = -1"}));
  EXPECT_TRUE(rejects([] { ck::grid_stride_blocks(10, 100, 132, 8); }, {"threads = 100"}));
  EXPECT_TRUE(rejects([] { ck::grid_stride_blocks(10, 2048, 132, 8); }, {"threads = 2048"}));
  EXPECT_TRUE(rejects([] { ck::grid_stride_blocks(10, 256, 0, 8); }, {"sms = 0"}));
  EXPECT_TRUE(rejects([] { ck::grid_stride_blocks(10, 256, 132, 0); }, {"blocks_per_sm = 0"}));
  EXPECT_TRUE(rejects([] { ck::vector_add_grid_stride(nullptr, nullptr, nullptr, -4, 256, nullptr); },
                      {"vector_add_grid_stride", "n = -4"}));
  EXPECT_TRUE(rejects([] { ck::vector_add_grid_stride(nullptr, nullptr, nullptr, 8, 48, nullptr); },
                      {"vector_add_grid_stride", "threads = 48"}));
  ck::vector_add_grid_stride(nullptr, nullptr, nullptr, 0, 256, nullptr);  // empty: no launch, no GPU needed
}

TEST(Kernels2_GridStride, MatchesTorch_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  for (int threads : {32, 256, 1024})
    for (int64_t n : {0, 1, 3, 255, 256, 257, 1'000'003}) {
      auto a = torch::randn({n}, on_gpu()), b = torch::randn({n}, on_gpu());
      EXPECT_TRUE(tensors_equal(ck::vector_add(a, b, ck::AddVersion::grid_stride, threads),
                                [&] { return a + b; }))
          << "n = " << n << ", threads = " << threads;
    }
}

// ---- TODO(cuda_kernels-3): float4 vector add ------------------------------------------------------

TEST(Kernels3_Float4, BadArgumentsAreErrorsAndEmptyLaunchesNothing) {
  EXPECT_TRUE(rejects([] { ck::vector_add_float4(nullptr, nullptr, nullptr, -1, 256, nullptr); },
                      {"vector_add_float4", "n = -1"}));
  EXPECT_TRUE(rejects([] { ck::vector_add_float4(nullptr, nullptr, nullptr, 8, 0, nullptr); },
                      {"vector_add_float4", "threads = 0"}));
  ck::vector_add_float4(nullptr, nullptr, nullptr, 0, 256, nullptr);
}

TEST(Kernels3_Float4, MatchesTorchWithTailsAndMisalignment_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  for (int threads : {32, 256, 1024})
    for (int64_t n : {0, 1, 3, 4, 5, 7, 255, 256, 257, 1'000'003}) {
      auto a = torch::randn({n}, on_gpu()), b = torch::randn({n}, on_gpu());
      EXPECT_TRUE(tensors_equal(ck::vector_add(a, b, ck::AddVersion::float4, threads), [&] { return a + b; }))
          << "n = " << n << ", threads = " << threads;
    }
  // Slices that start one float in: not 16-byte aligned.
  auto a = torch::randn({1001}, on_gpu()), b = torch::randn({1001}, on_gpu());
  auto a1 = a.narrow(0, 1, 1000), b1 = b.narrow(0, 1, 1000);
  EXPECT_TRUE(tensors_equal(ck::vector_add(a1, b1, ck::AddVersion::float4), [&] { return a1 + b1; }))
      << "a and b misaligned";
  EXPECT_TRUE(tensors_equal(ck::vector_add(a1, b.narrow(0, 0, 1000), ck::AddVersion::float4),
                            [&] { return a1 + b.narrow(0, 0, 1000); }))
      << "a misaligned";
}

TEST(Kernels3_Float4, Speed_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  const int64_t n = 100'000'000;
  auto a = torch::randn({n}, on_gpu()), b = torch::randn({n}, on_gpu());
  auto c = ck::vector_add(a, b, ck::AddVersion::float4);
  ASSERT_TRUE(tensors_equal(c, [&] { return a + b; }));
  // For the grader: each call adds b to the last call's sum (a chain, so no call can reuse another's).
  if (amplab::test::make_speed_calls_for_the_grader(
          {18000, {}, [&] { return std::vector{a = ck::vector_add(a, b, ck::AddVersion::float4)}; }}))
    return;
  auto copy = torch::empty_like(a);
  const double copy_gbs = 8.0 * n / (median_ms([&] { copy.copy_(a); }) * 1e6);
  const double add_gbs = 12.0 * n / (median_ms([&] { ck::vector_add(a, b, ck::AddVersion::float4); }) * 1e6);
  std::cout << "float4 add " << add_gbs << " GB/s, device copy " << copy_gbs << " GB/s\n";
  record_speed(add_gbs / copy_gbs, kReference.float4_vs_copy);
}

// ---- TODO(cuda_kernels-4..7): reductions ---------------------------------------------------------

using ReduceFn = void (*)(const float*, int64_t, float*, float*, int, cudaStream_t);

::testing::AssertionResult checks_block_size(ReduceFn reduce, const std::string& name) {
  auto a = rejects([&] { reduce(nullptr, 10, nullptr, nullptr, 96, nullptr); }, {name, "threads = 96", "power of two"});
  if (!a) return a;
  auto b = rejects([&] { reduce(nullptr, 10, nullptr, nullptr, 16, nullptr); }, {name, "threads = 16"});
  if (!b) return b;
  return rejects([&] { reduce(nullptr, -1, nullptr, nullptr, 256, nullptr); }, {name, "n = -1"});
}

// The sum on the GPU against a float64 sum on the CPU: fp32 trees lose a few ulps per level.
void expect_sums_right(ck::ReduceVersion version) {
  for (int threads : {32, 256, 1024})
    for (int64_t n : {0, 1, 31, 32, 33, 1000, 4097, (1 << 20) + 7}) {
      auto x = torch::rand({n}, on_gpu()) - 0.25;  // mostly positive: the sum grows with n
      auto sum = ck::reduce_sum(x, version, threads);
      ASSERT_EQ(sum.dim(), 0);
      const double got = sum.item<double>();
      // Computed after the call: while the student's code runs, the answer is nowhere in the process.
      const double expected = x.to(torch::kCPU).to(torch::kDouble).sum().item<double>();
      EXPECT_NEAR(got, expected, 1e-5 * std::abs(expected) + 1e-5)
          << ck::name(version) << ": n = " << n << ", threads = " << threads;
    }
}

TEST(Kernels4_Interleaved, BlockSizeMustBeAPowerOfTwo) { EXPECT_TRUE(checks_block_size(ck::reduce_interleaved, "reduce_interleaved")); }
TEST(Kernels4_Interleaved, MatchesDoubleSum_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  expect_sums_right(ck::ReduceVersion::interleaved);
}

TEST(Kernels5_Sequential, BlockSizeMustBeAPowerOfTwo) { EXPECT_TRUE(checks_block_size(ck::reduce_sequential, "reduce_sequential")); }
TEST(Kernels5_Sequential, MatchesDoubleSum_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  expect_sums_right(ck::ReduceVersion::sequential);
}

TEST(Kernels6_FirstAdd, BlockSizeMustBeAPowerOfTwo) { EXPECT_TRUE(checks_block_size(ck::reduce_first_add, "reduce_first_add")); }
TEST(Kernels6_FirstAdd, MatchesDoubleSum_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  expect_sums_right(ck::ReduceVersion::first_add);
}

TEST(Kernels7_WarpShuffle, BlockSizeMustBeAPowerOfTwo) { EXPECT_TRUE(checks_block_size(ck::reduce_warp_shuffle, "reduce_warp_shuffle")); }
TEST(Kernels7_WarpShuffle, MatchesDoubleSumAlsoMisaligned_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  expect_sums_right(ck::ReduceVersion::warp_shuffle);
  auto x = torch::rand({100'003}, on_gpu());
  for (int64_t offset : {1, 2, 3}) {  // slices starting off a 16-byte boundary
    auto slice = x.narrow(0, offset, 100'000);
    const double got = ck::reduce_sum(slice, ck::ReduceVersion::warp_shuffle).item<double>();
    const double expected = slice.to(torch::kCPU).to(torch::kDouble).sum().item<double>();  // after the call
    EXPECT_NEAR(got, expected, 1e-5 * expected) << "offset " << offset;
  }
  // Many times one wave of threads (the grid-stride loop); 2^24 ones: every partial sum is exact in fp32.
  auto big = torch::ones({1 << 24}, on_gpu());
  EXPECT_EQ(ck::reduce_sum(big, ck::ReduceVersion::warp_shuffle).item<double>(), double{1 << 24});
}

TEST(Kernels7_WarpShuffle, Speed_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  auto x = torch::rand({100'000'000}, on_gpu());
  const double expected = x.to(torch::kDouble).sum().item<double>();
  ASSERT_NEAR(ck::reduce_sum(x, ck::ReduceVersion::warp_shuffle).item<double>(), expected, 1e-5 * expected);
  if (amplab::test::make_speed_calls_for_the_grader(
          {40000, [&](int) { x.uniform_(); },
           [&] { return std::vector{ck::reduce_sum(x, ck::ReduceVersion::warp_shuffle)}; }, 1e-5}))
    return;
  const double torch_ms = median_ms([&] { x.sum(); });
  const double ours_ms = median_ms([&] { ck::reduce_sum(x, ck::ReduceVersion::warp_shuffle); });
  std::cout << "warp shuffles " << 4e8 / (ours_ms * 1e6) << " GB/s, torch.sum " << 4e8 / (torch_ms * 1e6) << " GB/s\n";
  record_speed(torch_ms / ours_ms, kReference.warp_reduce_vs_torch_sum);
}

// ---- TODO(cuda_kernels-8): tiled convolution ----------------------------------------------------

// torch's conv2d with zero padding, in true fp32 (cuDNN may use TF32 otherwise).
torch::Tensor torch_conv(const torch::Tensor& image, const torch::Tensor& filter) {
  amplab::Tf32Guard fp32(false);
  return torch::conv2d(image.view({1, 1, image.size(0), image.size(1)}),
                       filter.view({1, 1, filter.size(0), filter.size(1)}), {}, 1, filter.size(0) / 2)
      .view({image.size(0), image.size(1)});
}

TEST(Kernels8_ConvTiled, OnlyThreeAndFiveTapFilters) {
  EXPECT_TRUE(rejects([] { ck::conv2d_tiled(nullptr, 8, 8, nullptr, 3, nullptr, nullptr); }, {"conv2d_tiled", "radius = 3"}));
  EXPECT_TRUE(rejects([] { ck::conv2d_tiled(nullptr, 8, 8, nullptr, 0, nullptr, nullptr); }, {"conv2d_tiled", "radius = 0"}));
  EXPECT_TRUE(rejects([] { ck::conv2d_tiled(nullptr, -1, 8, nullptr, 1, nullptr, nullptr); }, {"conv2d_tiled", "h = -1"}));
  ck::conv2d_tiled(nullptr, 0, 8, nullptr, 1, nullptr, nullptr);  // empty image: nothing to do
}

TEST(Kernels8_ConvTiled, MatchesTorchConv2d_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  for (int64_t size : {3, 5})
    for (auto [h, w] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {1, 7}, {6, 1}, {33, 70}, {64, 64}, {100, 257}}) {
      auto image = torch::randn({h, w}, on_gpu()), filter = torch::randn({size, size}, on_gpu());
      EXPECT_TRUE(tensors_close(ck::conv2d(image, filter, ck::ConvVersion::tiled),
                                [&] { return torch_conv(image, filter); }, 1e-5, 1e-5))
          << size << "x" << size << " filter, " << h << " x " << w << " image";
    }
  auto empty = torch::empty({0, 9}, on_gpu());
  EXPECT_EQ(ck::conv2d(empty, torch::ones({3, 3}, on_gpu()), ck::ConvVersion::tiled).sizes(), empty.sizes());
}

TEST(Kernels8_ConvTiled, Speed_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  auto image = torch::rand({4096, 4096}, on_gpu());
  auto blur = torch::full({3, 3}, 1.0 / 9, on_gpu());
  ASSERT_TRUE(tensors_close(ck::conv2d(image, blur, ck::ConvVersion::tiled), [&] { return torch_conv(image, blur); },
                            1e-5, 1e-5));
  if (amplab::test::make_speed_calls_for_the_grader(
          {60000, [&](int) { image.uniform_(); }, [&] { return std::vector{ck::conv2d(image, blur, ck::ConvVersion::tiled)}; }}))
    return;
  auto batch = image.view({1, 1, 4096, 4096});
  auto weight = blur.view({1, 1, 3, 3});
  const double torch_ms = median_ms([&] { torch::conv2d(batch, weight, {}, 1, 1); });  // PyTorch's defaults
  const double ours_ms = median_ms([&] { ck::conv2d(image, blur, ck::ConvVersion::tiled); });
  std::cout << "tiled " << ours_ms << " ms, torch conv2d " << torch_ms << " ms\n";
  record_speed(torch_ms / ours_ms, kReference.tiled_conv_vs_torch);
}

// ---- TODO(cuda_kernels-9..12): matrix multiply -------------------------------------------------------

using MatmulFn = void (*)(const float*, const float*, float*, int64_t, int64_t, int64_t, cudaStream_t);

::testing::AssertionResult checks_sizes(MatmulFn matmul, const std::string& name) {
  auto a = rejects([&] { matmul(nullptr, nullptr, nullptr, -1, 4, 4, nullptr); }, {name, "m = -1"});
  if (!a) return a;
  auto b = rejects([&] { matmul(nullptr, nullptr, nullptr, 4, 4, -2, nullptr); }, {name, "k = -2"});
  if (!b) return b;
  auto c = rejects([&] { matmul(nullptr, nullptr, nullptr, 4, int64_t{1} << 31, 4, nullptr); }, {name, "n = 2147483648"});
  if (!c) return c;
  matmul(nullptr, nullptr, nullptr, 0, 4, 4, nullptr);  // empty C: nothing to do, no GPU needed
  return ::testing::AssertionSuccess();
}

// (m, n, k): edges, empty, k == 0, sizes off every tile, and tile multiples (the fast paths).
const std::vector<std::array<int64_t, 3>> kMatmulShapes = {{1, 1, 1},     {0, 4, 3},      {4, 0, 3},      {5, 3, 0},
                                                          {17, 33, 65},  {128, 128, 128}, {130, 129, 70}, {256, 384, 520},
                                                          {128, 256, 8}, {300, 1, 200}};

void expect_fp32_matmul_right(ck::MatmulVersion version) {
  amplab::Tf32Guard fp32(false);  // the reference in true fp32
  for (auto [m, n, k] : kMatmulShapes) {
    auto a = torch::randn({m, k}, on_gpu()), b = torch::randn({k, n}, on_gpu());
    EXPECT_TRUE(tensors_close(ck::matmul(a, b, version), [&] { return torch::mm(a, b); }, 1e-4, 1e-4))
        << ck::name(version) << ": m = " << m << ", n = " << n << ", k = " << k;
  }
}

TEST(Kernels9_MatmulNaive, SizesAreChecked) { EXPECT_TRUE(checks_sizes(ck::matmul_naive, "matmul_naive")); }
TEST(Kernels9_MatmulNaive, MatchesTorch_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  expect_fp32_matmul_right(ck::MatmulVersion::naive);
}

TEST(Kernels10_MatmulTiled, SizesAreChecked) { EXPECT_TRUE(checks_sizes(ck::matmul_tiled, "matmul_tiled")); }
TEST(Kernels10_MatmulTiled, MatchesTorch_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  expect_fp32_matmul_right(ck::MatmulVersion::tiled);
}

TEST(Kernels11_MatmulRegisterBlocked, SizesAreChecked) {
  EXPECT_TRUE(checks_sizes(ck::matmul_register_blocked, "matmul_register_blocked"));
}
TEST(Kernels11_MatmulRegisterBlocked, MatchesTorch_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  expect_fp32_matmul_right(ck::MatmulVersion::register_blocked);
  amplab::Tf32Guard fp32(false);
  auto a = torch::randn({257, 129}, on_gpu()), b = torch::randn({129, 385}, on_gpu());
  auto a1 = a.narrow(1, 1, 128).contiguous();
  auto b_storage = torch::randn({128 * 384 + 1}, on_gpu());
  auto b1 = b_storage.narrow(0, 1, 128 * 384).view({128, 384});  // tile multiples, misaligned
  auto a2 = torch::randn({256, 128}, on_gpu());
  EXPECT_TRUE(tensors_close(ck::matmul(a2, b1, ck::MatmulVersion::register_blocked), [&] { return torch::mm(a2, b1); },
                            1e-4, 1e-4))
      << "b not 16-byte aligned";
  EXPECT_TRUE(tensors_close(ck::matmul(a1, b.narrow(0, 0, 128).contiguous(), ck::MatmulVersion::register_blocked),
                            [&] { return torch::mm(a1, b.narrow(0, 0, 128)); }, 1e-4, 1e-4));
}

TEST(Kernels11_MatmulRegisterBlocked, Speed_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  amplab::Tf32Guard fp32(false);  // cuBLAS in true fp32, as our kernel
  auto a = torch::randn({4096, 4096}, on_gpu()), b = torch::randn({4096, 4096}, on_gpu());
  ASSERT_TRUE(tensors_close(ck::matmul(a, b, ck::MatmulVersion::register_blocked), [&] { return torch::mm(a, b); },
                            1e-3, 1e-3));
  if (amplab::test::make_speed_calls_for_the_grader(
          {1800, [&](int) { a.normal_(); },
           [&] { return std::vector{ck::matmul(a, b, ck::MatmulVersion::register_blocked)}; }, 1e-3}))
    return;
  const double cublas_ms = median_ms([&] { torch::mm(a, b); }, 5, 5);
  const double ours_ms = median_ms([&] { ck::matmul(a, b, ck::MatmulVersion::register_blocked); }, 5, 5);
  const double flops = 2.0 * 4096 * 4096 * 4096;
  std::cout << "register-blocked " << flops / (ours_ms * 1e9) << " TFLOP/s, cuBLAS fp32 " << flops / (cublas_ms * 1e9)
            << " TFLOP/s\n";
  record_speed(cublas_ms / ours_ms, kReference.register_blocked_vs_cublas);
}

TEST(Kernels12_MatmulWmma, SizesAreChecked) {
  auto wmma = [](const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k, cudaStream_t s) {
    ck::matmul_wmma_bf16(a, b, c, m, n, k, s);
  };
  EXPECT_TRUE(checks_sizes(wmma, "matmul_wmma_bf16"));
}

TEST(Kernels12_MatmulWmma, MatchesTorchBf16_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  std::vector<std::array<int64_t, 3>> shapes = kMatmulShapes;
  shapes.push_back({16, 16, 16});
  shapes.push_back({256, 128, 512});
  for (auto [m, n, k] : shapes) {
    auto a = torch::randn({m, k}, on_gpu(torch::kBFloat16)), b = torch::randn({k, n}, on_gpu(torch::kBFloat16));
    auto c = ck::matmul(a, b, ck::MatmulVersion::wmma_bf16);
    ASSERT_EQ(c.scalar_type(), torch::kBFloat16);
    // Against the exact products of the same bf16 inputs, in fp32: ours is rounded once to bf16
    // (2^-8 relative) after sums in fp32.
    auto expected = torch::mm(a.to(torch::kFloat32), b.to(torch::kFloat32));
    EXPECT_TRUE(tensors_close(c.to(torch::kFloat32), expected, 1e-2, 1e-2 * std::sqrt(static_cast<double>(k) + 1)))
        << "m = " << m << ", n = " << n << ", k = " << k;
  }
}

// ---- TODO(cuda_kernels-13..15): fused bias + GELU ----------------------------------------------------

// Tolerances per dtype: fp32 differs from PyTorch's kernels by float rounding of the same formula;
// bf16 results are rounded to 8 bits of mantissa, so a last-bit difference is 2^-8 relative.
double rtol(torch::ScalarType dtype) { return dtype == torch::kBFloat16 ? 1e-2 : 1e-5; }
double atol(torch::ScalarType dtype) { return dtype == torch::kBFloat16 ? 1e-2 : 1e-5; }

const std::vector<std::pair<int64_t, int64_t>> kGeluShapes = {{0, 5}, {3, 0}, {1, 1}, {3, 7}, {64, 1000}, {257, 4096}, {129, 40}};

TEST(Kernels13_BiasGeluForward, SizesAndDtypeAreChecked) {
  EXPECT_TRUE(rejects([] { ck::bias_gelu_forward(nullptr, nullptr, nullptr, -1, 4, ck::DType::f32, nullptr); },
                      {"bias_gelu_forward", "rows = -1"}));
  EXPECT_TRUE(rejects([] { ck::bias_gelu_forward(nullptr, nullptr, nullptr, 4, -2, ck::DType::bf16, nullptr); },
                      {"bias_gelu_forward", "cols = -2"}));
  EXPECT_TRUE(rejects([] { ck::bias_gelu_forward(nullptr, nullptr, nullptr, 4, 4, static_cast<ck::DType>(7), nullptr); },
                      {"bias_gelu_forward", "dtype"}));
  ck::bias_gelu_forward(nullptr, nullptr, nullptr, 0, 4, ck::DType::f32, nullptr);  // empty: nothing to do
}

TEST(Kernels13_BiasGeluForward, MatchesComposedOps_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  for (auto dtype : {torch::kFloat32, torch::kBFloat16})
    for (auto [rows, cols] : kGeluShapes) {
      auto x = 3 * torch::randn({rows, cols}, on_gpu(dtype)), bias = torch::randn({cols}, on_gpu(dtype));
      auto y = ck::bias_gelu_forward(x, bias);
      ASSERT_EQ(y.scalar_type(), dtype);
      EXPECT_TRUE(tensors_close(y, [&] { return ck::bias_gelu_composed(x, bias); }, rtol(dtype), atol(dtype)))
          << c10::toString(dtype) << " " << rows << " x " << cols;
    }
}

TEST(Kernels14_BiasGeluBackward, SizesAndDtypeAreChecked) {
  EXPECT_TRUE(rejects([] { ck::bias_gelu_backward(nullptr, nullptr, nullptr, nullptr, nullptr, -3, 4, ck::DType::f32, nullptr); },
                      {"bias_gelu_backward", "rows = -3"}));
  EXPECT_TRUE(rejects([] { ck::bias_gelu_backward(nullptr, nullptr, nullptr, nullptr, nullptr, 4, -1, ck::DType::f32, nullptr); },
                      {"bias_gelu_backward", "cols = -1"}));
  EXPECT_TRUE(rejects([] { ck::bias_gelu_backward(nullptr, nullptr, nullptr, nullptr, nullptr, 4, 4, static_cast<ck::DType>(-1), nullptr); },
                      {"bias_gelu_backward", "dtype"}));
  ck::bias_gelu_backward(nullptr, nullptr, nullptr, nullptr, nullptr, 4, 0, ck::DType::bf16, nullptr);  // no columns
}

// The gradients autograd computes for the composed ops: (dx, dbias).
std::pair<torch::Tensor, torch::Tensor> composed_gradients(const torch::Tensor& x, const torch::Tensor& bias,
                                                           const torch::Tensor& grad_y) {
  auto xl = x.detach().requires_grad_(true), bl = bias.detach().requires_grad_(true);
  auto grads = torch::autograd::grad({ck::bias_gelu_composed(xl, bl)}, {xl, bl}, {grad_y});
  return {grads[0], grads[1]};
}

TEST(Kernels14_BiasGeluBackward, MatchesAutogradOfComposedOps_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  for (auto dtype : {torch::kFloat32, torch::kBFloat16})
    for (auto [rows, cols] : kGeluShapes) {
      auto x = 3 * torch::randn({rows, cols}, on_gpu(dtype)), bias = torch::randn({cols}, on_gpu(dtype));
      auto grad_y = torch::randn({rows, cols}, on_gpu(dtype));
      auto [grad_x, grad_bias] = ck::bias_gelu_backward(grad_y, x, bias);
      auto [want_x, want_bias] = composed_gradients(x, bias, grad_y);
      const std::string where = std::string(c10::toString(dtype)) + " " + std::to_string(rows) + " x " + std::to_string(cols);
      EXPECT_TRUE(tensors_close(grad_x, want_x, rtol(dtype), atol(dtype))) << where << ": grad_x";
      // A column sum of `rows` terms: the order of the fp32 additions differs.
      const double sum_atol = atol(dtype) * std::sqrt(static_cast<double>(rows) + 1) * 4;
      EXPECT_TRUE(tensors_close(grad_bias, want_bias, rtol(dtype), sum_atol)) << where << ": grad_bias";
    }
}

TEST(Kernels15_Autograd, RejectsTensorsOffTheGpu) {
  auto x = torch::randn({4, 3}), bias = torch::randn({3});
  EXPECT_TRUE(rejects([&] { ck::bias_gelu(x, bias); }, {"x is on cpu", "GPU"}));
  auto gx = torch::randn({4, 3}, torch::TensorOptions().device(torch::kMeta));
  EXPECT_TRUE(rejects([&] { ck::bias_gelu(gx, bias.to(torch::kMeta)); }, {"x is on meta"}));
}

TEST(Kernels15_Autograd, GradientsMatchComposedOps_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  for (auto dtype : {torch::kFloat32, torch::kBFloat16})
    for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {37, 130}, {256, 1024}}) {
      auto x = (3 * torch::randn({rows, cols}, on_gpu(dtype))).requires_grad_(true);
      auto bias = torch::randn({cols}, on_gpu(dtype)).requires_grad_(true);
      auto weight = torch::randn({rows, cols}, on_gpu(dtype));
      auto y = ck::bias_gelu(x, bias);
      ASSERT_TRUE(y.requires_grad()) << "the fused op must be differentiable";
      EXPECT_TRUE(tensors_close(y.detach(), [&] { return ck::bias_gelu_composed(x.detach(), bias.detach()); },
                                rtol(dtype), atol(dtype)));
      (y * weight).sum().backward();  // the incoming gradient is weight (sum's gradient is an expanded tensor)
      auto [want_x, want_bias] = composed_gradients(x, bias, weight);
      EXPECT_TRUE(tensors_close(x.grad(), want_x, rtol(dtype), atol(dtype))) << c10::toString(dtype) << " grad_x";
      EXPECT_TRUE(tensors_close(bias.grad(), want_bias, rtol(dtype), atol(dtype) * std::sqrt(rows + 1.0) * 4))
          << c10::toString(dtype) << " grad_bias";
    }
  // As in a bf16 autocast MLP: bf16 activations, an fp32 bias parameter; its gradient comes back fp32.
  auto x = torch::randn({64, 256}, on_gpu(torch::kBFloat16)).requires_grad_(true);
  auto bias = torch::randn({256}, on_gpu()).requires_grad_(true);
  ck::bias_gelu(x, bias).sum().backward();
  ASSERT_TRUE(bias.grad().defined());
  EXPECT_EQ(bias.grad().scalar_type(), torch::kFloat32);
  EXPECT_EQ(x.grad().scalar_type(), torch::kBFloat16);
}

TEST(Kernels15_Autograd, SmallMlpLearns_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  torch::manual_seed(0);
  // y = sum of sin(x_i): an MLP with the fused op between two bias-free linears learns it.
  torch::nn::Linear fc1(torch::nn::LinearOptions(16, 128).bias(false)), fc2(128, 1);
  fc1->to(gpu());
  fc2->to(gpu());
  auto bias = torch::zeros({128}, on_gpu()).requires_grad_(true);
  std::vector<torch::Tensor> params = fc1->parameters();
  for (auto& p : fc2->parameters()) params.push_back(p);
  params.push_back(bias);
  torch::optim::Adam optimizer(params, torch::optim::AdamOptions(3e-3));
  auto x = torch::randn({512, 16}, on_gpu());
  auto target = torch::sin(x).sum(1, /*keepdim=*/true);
  auto loss_of = [&] { return torch::mse_loss(fc2(ck::bias_gelu(fc1(x), bias)), target); };
  const double first = loss_of().item<double>();
  for (int step = 0; step < 400; ++step) {
    optimizer.zero_grad();
    auto loss = loss_of();
    loss.backward();
    optimizer.step();
  }
  const double last = loss_of().item<double>();
  EXPECT_LT(last, 0.25 * first) << "loss " << first << " -> " << last;  // typically far lower
}

TEST(Kernels15_Autograd, FusedBeatsComposed_CUDA) {
  AMPLAB_REQUIRE_CUDA();
  const int64_t rows = 8192, cols = 8192;
  auto x = torch::randn({rows, cols}, on_gpu(torch::kBFloat16)).requires_grad_(true);
  auto bias = torch::randn({cols}, on_gpu(torch::kBFloat16)).requires_grad_(true);
  auto grad_y = torch::randn({rows, cols}, on_gpu(torch::kBFloat16));
  auto step = [&](auto op) { return torch::autograd::grad({op(x, bias)}, {x, bias}, {grad_y}); };
  auto fused = step(ck::bias_gelu);
  auto composed = step(ck::bias_gelu_composed);
  ASSERT_TRUE(tensors_close(fused[0], composed[0], rtol(torch::kBFloat16), atol(torch::kBFloat16)));
  auto fresh_x = [&](int) {
    torch::NoGradGuard no_grad;
    x.normal_();
  };
  if (amplab::test::make_speed_calls_for_the_grader({20000, fresh_x, [&] { return step(ck::bias_gelu); }, 1e-2})) return;
  const double composed_ms = median_ms([&] { step(ck::bias_gelu_composed); }, 5, 7);
  const double fused_ms = median_ms([&] { step(ck::bias_gelu); }, 5, 7);
  std::cout << "forward + backward, 8192 x 8192 bf16: fused " << fused_ms << " ms, composed " << composed_ms << " ms\n";
  record_speed(composed_ms / fused_ms, kReference.fused_vs_composed);
}

}  // namespace
