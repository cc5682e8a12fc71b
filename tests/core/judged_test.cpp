// What crosses from a graded student's process to the judge's (tests/support/judged.hpp), for a
// tensor check whose expected side is given as a function: the student's process never computes
// it, so the student's code cannot find the answer in its own memory; the judge computes its own.
// Each side runs in a forked child process (a death test): the role is the whole process's. The
// children leave by _exit: a forked child has none of the parent's threads, and the destructors
// std::exit runs would wait for torch's.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "support.hpp"

namespace amplab::test {
namespace {

// The one check both sides make (the judge matches an observation by its file and line).
int expected_computed = 0;
bool check_doubled(const torch::Tensor& actual) {
  const torch::Tensor input = torch::arange(4, torch::kFloat32);
  return static_cast<bool>(tensors_close(actual, [&] { ++expected_computed; return input * 2; }, 0, 1e-6,
                                         "judged_test.cpp", 1));
}

void as_student(const std::string& observations, const torch::Tensor& actual, bool computes_expected) {
  judged::become_student(::open(observations.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600), computes_expected);
  const bool passed = check_doubled(actual);
  _exit((passed ? 0 : 1) + (expected_computed ? 2 : 0));  // 0: passed, and the answer was never computed
}

void as_judge(const std::string& observations) {
  judged::become_judge(observations);
  const bool passed = check_doubled(torch::arange(4, torch::kFloat32) * 2);  // the reference's actual side
  _exit(passed ? 0 : 1);
}

TEST(Judged, AnExpectedSideGivenAsAFunctionIsComputedByTheJudgeOnly) {
  GTEST_FLAG_SET(death_test_style, "fast");  // forked: the children see the parent's TempDir
  TempDir dir;
  const std::string observations = dir.file("observations");
  const torch::Tensor right = torch::arange(4, torch::kFloat32) * 2, wrong = right + 0.5;

  EXPECT_EXIT(as_student(observations, right, false), testing::ExitedWithCode(0), "");
  EXPECT_EXIT(as_judge(observations), testing::ExitedWithCode(0), "") << "the right answer";
  EXPECT_EXIT(as_student(observations, wrong, false), testing::ExitedWithCode(0), "")
      << "the student's process can neither compute the answer nor fail the check";
  EXPECT_EXIT(as_judge(observations), testing::ExitedWithCode(1), "") << "a wrong answer fails at the judge";

  // The student's code run alone (no reference in its binary): the expected side is computed there,
  // and the student is shown the difference.
  EXPECT_EXIT(as_student(observations, wrong, true), testing::ExitedWithCode(1 + 2), "");
}

// Checks made on several threads at once (a test's rank threads) reach the judge whole, and the
// judge takes each student observation once.
bool check_on_threads(int threads, int checks) {
  std::vector<std::thread> pool;
  std::vector<int> passed(threads, 0);
  for (int i = 0; i < threads; ++i)
    pool.emplace_back([&, i] {
      for (int c = 0; c < checks; ++c) passed[i] += check_doubled(torch::arange(4, torch::kFloat32) * 2) ? 1 : 0;
    });
  for (auto& thread : pool) thread.join();
  for (int count : passed)
    if (count != checks) return false;
  return true;
}

TEST(Judged, ChecksFromSeveralThreadsAreEachJudgedOnce) {
  GTEST_FLAG_SET(death_test_style, "fast");
  TempDir dir;
  const std::string observations = dir.file("observations");
  auto student = [&] {
    judged::become_student(::open(observations.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600));
    _exit(check_on_threads(8, 1000) ? 0 : 1);
  };
  auto judge = [&] {
    judged::become_judge(observations);
    _exit(check_on_threads(8, 1000) && judged::unconsumed().empty() ? 0 : 1);
  };
  EXPECT_EXIT(student(), testing::ExitedWithCode(0), "");
  EXPECT_EXIT(judge(), testing::ExitedWithCode(0), "");
}

// A forged stream that withholds the second operand of a check that gives it as a tensor: in a
// check written expected-first the second operand is the student's output, and withholding it
// would skip the judge's only look at it. The judge accepts a withheld operand only where its own
// check gave the expected side as a function.
bool check_plain_tensor(const torch::Tensor& value) {
  return static_cast<bool>(tensors_close(torch::arange(4, torch::kFloat32) * 2, value, 0, 1e-6, "judged_test.cpp", 2));
}

TEST(Judged, AWithheldOperandOfACheckWithoutAFunctionFails) {
  GTEST_FLAG_SET(death_test_style, "fast");
  TempDir dir;
  const std::string observations = dir.file("observations");
  auto student = [&] {  // the attacker: the check at line 2 observed with its second operand withheld
    judged::become_student(::open(observations.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600));
    judged::Operand withheld;
    withheld.tag = judged::Operand::Tag::withheld;
    judged::observe(judged::Kind::tensors_close, "judged_test.cpp", 2,
                    {judged::tensor_operand(torch::arange(4, torch::kFloat32) * 2), withheld},
                    ::testing::AssertionSuccess(), 1e-6, 0);
    _exit(0);
  };
  auto judge = [&] {
    judged::become_judge(observations);
    _exit(check_plain_tensor(torch::arange(4, torch::kFloat32) * 2) ? 0 : 1);
  };
  EXPECT_EXIT(student(), testing::ExitedWithCode(0), "");
  EXPECT_EXIT(judge(), testing::ExitedWithCode(1), "");
}

// A forged stream whose first operand, the student's actual side, is withheld too: nothing would
// be compared, so the judge fails it.
TEST(Judged, AWithheldActualSideFails) {
  GTEST_FLAG_SET(death_test_style, "fast");
  TempDir dir;
  std::string body;
  auto bytes = [&](const void* data, size_t n) { body.append(static_cast<const char*>(data), n); };
  const uint8_t kind = 11, own_passed = 1, operands = 2, withheld = 'w';  // Kind::tensors_close
  const uint32_t line = 1, file_length = 15;
  bytes(&kind, 1);
  bytes(&line, 4);
  bytes(&file_length, 4);
  body += "judged_test.cpp";
  bytes(&own_passed, 1);
  bytes(&operands, 1);
  bytes(&withheld, 1);
  bytes(&withheld, 1);
  const uint32_t frame_length = static_cast<uint32_t>(body.size() + 1);
  std::ofstream(dir.file("observations"), std::ios::binary)
      << std::string(reinterpret_cast<const char*>(&frame_length), 4) << 'O' << body;
  EXPECT_EXIT(as_judge(dir.file("observations")), testing::ExitedWithCode(1), "");
}

}  // namespace
}  // namespace amplab::test
