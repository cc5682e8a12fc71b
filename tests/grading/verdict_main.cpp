// The main() of the judge: the test binaries linked with the reference only (<lab>_test_judge),
// which run no student code. scripts/grade runs a graded test first in the student's process
// (tests/grading/student_main.cpp), then here, with that run's observations
// (AMPLAB_STUDENT_OBSERVATIONS, a file): each check of the test is decided here on the student's
// operands against this run's (tests/support/judged.hpp). One more gtest listener tells the grader
// what happened through a pipe it opened (AMPLAB_VERDICT_FD); the grader decides pass or fail from
// these lines alone. Each line starts with a token made anew for every grading run and compiled
// into this file only (verdict_token.hpp, written by scripts/grade), so a line anyone else writes
// on that pipe is recognised as forged. Lines, in order:
//   <token> main <number of tests the filter selected>
//   <token> start <Suite.Test>
//   <token> part <failure|skip|success> <file:line\nmessage, escaped>   (each assertion result)
//   <token> end <passed|failed|skipped>
// Failures are sent as they happen, before the test ends, so clearing a test's recorded result
// afterwards does not hide them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "judged_role.hpp"
#include "verdict_token.hpp"  // kTokenA, kTokenB: the token is their XOR (not stored in one piece)

namespace {

std::string token() {
  static_assert(sizeof(kTokenA) == sizeof(kTokenB), "the token's halves differ in length");
  std::string out;
  const char* hex = "0123456789abcdef";
  for (size_t i = 0; i < sizeof(kTokenA); ++i) {
    const unsigned byte = static_cast<unsigned>(kTokenA[i] ^ kTokenB[i]) & 0xffu;
    out += hex[byte >> 4];
    out += hex[byte & 15];
  }
  return out;
}

// One line: newlines and backslashes escaped, so a message cannot start a line of its own.
std::string escaped(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else out += c;
  }
  return out;
}

class VerdictListener : public testing::EmptyTestEventListener {
 public:
  explicit VerdictListener(int fd) : fd_(fd) {}

  // The run begins (main() was reached and the filter applied): how many tests it selected
  // (0: the test asked for is not in this binary).
  void OnTestIterationStart(const testing::UnitTest& unit_test, int) override {
    send("main " + std::to_string(unit_test.test_to_run_count()));
  }

  void OnTestStart(const testing::TestInfo& test) override {
    amplab::test::judged::start_test();
    send(std::string("start ") + test.test_suite_name() + "." + test.name());
  }

  void OnTestPartResult(const testing::TestPartResult& part) override {
    const char* kind = part.failed() ? "failure" : part.skipped() ? "skip" : "success";
    std::string where = part.file_name() ? std::string(part.file_name()) + ":" + std::to_string(part.line_number())
                                         : std::string("unknown file");
    send(std::string("part ") + kind + " " + escaped(where + "\n" + part.message()));
  }

  void OnTestEnd(const testing::TestInfo& test) override {
    const testing::TestResult* result = test.result();
    const std::string left_over = amplab::test::judged::unconsumed();
    if (!left_over.empty()) send("part failure " + escaped("judged outside your process\n" + left_over));
    const char* status = result->Failed() || !left_over.empty() ? "failed" : result->Skipped() ? "skipped" : "passed";
    send(std::string("end ") + status);
  }

 private:
  void send(const std::string& line) {
    const std::string text = token() + " " + line + "\n";
    size_t done = 0;
    while (done < text.size()) {
      ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // the grader is gone: nothing to tell
      done += static_cast<size_t>(n);
    }
  }

  int fd_;
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (const char* observations = std::getenv("AMPLAB_STUDENT_OBSERVATIONS"))
    amplab::test::judged::become_judge(observations);
  if (const char* fd = std::getenv("AMPLAB_VERDICT_FD")) {  // gtest owns the listener from here
    testing::UnitTest::GetInstance()->listeners().Append(new VerdictListener(std::atoi(fd)));
  }
  return RUN_ALL_TESTS();
}
