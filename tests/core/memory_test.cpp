// The core's memory infrastructure and lab 3's given training snapshot (what its batch finder
// restores after each trial): the out-of-memory helpers and the per-phase tracker. The levers themselves
// (checkpointing, the finder, the estimate) are lab 3's (tests/labs/memory_optimization_test.cpp).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function_hook.h>

#include <fstream>

#include "given/training_snapshot.hpp"
#include "amplab/infra/error.hpp"
#include "amplab/measure/fits.hpp"
#include "amplab/measure/memory.hpp"
#include "amplab/train/precision.hpp"
#include "support.hpp"

namespace amplab {
namespace {

TEST(TrainingSnapshot, OtherOptimizersRoundTripThroughTheirSerialization) {
  torch::manual_seed(0);
  torch::nn::Linear net(4, 3);
  torch::optim::RMSprop rmsprop(net->parameters(), torch::optim::RMSpropOptions(0.01).momentum(0.5));
  auto step = [&] {
    rmsprop.zero_grad();
    net->forward(torch::randn({8, 4})).pow(2).mean().backward();
    rmsprop.step();
  };
  step();
  auto weight = net->weight.detach().clone();
  auto& state = static_cast<torch::optim::RMSpropParamState&>(*rmsprop.state().at(net->weight.unsafeGetTensorImpl()));
  auto square_avg = state.square_avg().clone();
  memory_optimization::TrainingSnapshot snapshot(*net, &rmsprop);
  step();
  step();
  static_cast<torch::optim::RMSpropOptions&>(rmsprop.param_groups()[0].options()).lr(1.0);
  snapshot.restore();
  EXPECT_TRUE(test::tensors_equal(net->weight, weight));
  auto& restored = static_cast<torch::optim::RMSpropParamState&>(*rmsprop.state().at(net->weight.unsafeGetTensorImpl()));
  EXPECT_TRUE(test::tensors_equal(restored.square_avg(), square_avg));
  EXPECT_EQ(restored.step(), 1);
  EXPECT_EQ(static_cast<torch::optim::RMSpropOptions&>(rmsprop.param_groups()[0].options()).lr(), 0.01);
}

// ---- out-of-memory helpers ----------------------------------------------------------------------

TEST(MemoryHelpers, RecognisesOutOfMemoryErrors) {
  try {
    TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79 GiB\nIf reserved...");
  } catch (const std::exception& e) {
    EXPECT_TRUE(is_out_of_memory(e));
    EXPECT_EQ(oom_summary(e), "CUDA out of memory. Tried to allocate 2.00 GiB");
  }
  try {
    TORCH_CHECK(false, "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)");
  } catch (const std::exception& e) {
    EXPECT_TRUE(is_out_of_memory(e)) << "cuBLAS workspace allocation";
  }
  EXPECT_FALSE(is_out_of_memory(std::runtime_error("index out of range")));
  EXPECT_TRUE(test::throws_with([] { limit_device_memory(torch::kCPU, 1 << 30); }, {"needs a GPU"}));
  EXPECT_EQ(device_total_memory(torch::kCPU), 0);
  free_cached_memory(torch::kCPU);  // a no-op
}

// A configuration larger than the machine is refused before allocating, naming the keys to
// lower and the bytes it needs; one that fits passes.
TEST(MemoryHelpers, AConfigurationThatCannotFitNamesTheKeysAndTheBytes) {
  ASSERT_GT(available_cpu_bytes(), 0);
  const int64_t huge = int64_t{1} << 60;
  EXPECT_TRUE(test::throws_with([&] { require_cpu_memory(huge, "the model", "mem.model.width or mem.model.depth"); },
                                {"the model needs at least " + std::to_string(huge) + " bytes", "GiB are available",
                                 "lower mem.model.width or mem.model.depth"}));
  EXPECT_NO_THROW(require_cpu_memory(1 << 20, "the model", "mem.model.width"));
}

TEST(MemoryHelpers, TrackerSamplesInsideAPhase) {
  MemoryConfig c;
  MemoryTracker tracker(torch::kCPU, c);
  tracker.sample();  // no phase open: ignored
  tracker.begin(Phase::forward);
  tracker.sample();
  tracker.sample();
  tracker.begin(Phase::backward);
  tracker.end_step(0);
  const auto& t = tracker.timeline();
  ASSERT_EQ(t.size(), 4u);
  EXPECT_FALSE(t[0].phase_end);
  EXPECT_EQ(t[0].phase, Phase::forward);
  EXPECT_TRUE(t[2].phase_end);
  EXPECT_EQ(t[3].phase, Phase::backward);
  test::TempDir dir;
  tracker.write_timeline_csv(dir.file("t.csv"));
  std::ifstream in(dir.file("t.csv"));
  std::string header, first;
  std::getline(in, header);
  std::getline(in, first);
  EXPECT_NE(header.find(",event"), std::string::npos);
  EXPECT_NE(first.find(",sample"), std::string::npos);
}

}  // namespace
}  // namespace amplab
