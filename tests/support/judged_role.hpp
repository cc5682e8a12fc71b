// Which side of a graded run this process is (judged.hpp says what that means), without torch's
// headers: the grading mains include only this.
#pragma once

#include <string>

namespace amplab::test::judged {

enum class Role { plain, student, judge };
Role role();
// Whether this process computes the expected side of a check given as a function (support.hpp):
// in a plain run and in the judge's, not in a graded student's process.
bool computes_expected();
// The student's main: observations go to this file descriptor. The judge's main: the student's
// observations of this test are read from this file (a missing or damaged file fails every check).
// `computes_expected`: whether the checks' expected values are computed in this student's process
// (support.hpp's tensors_close with a function); only in a run of the student's code alone, which
// holds no reference and whose failures the student is shown.
void become_student(int fd, bool computes_expected = false);
void become_judge(const std::string& observations_file);
// As each test starts, in both runs: torch's generators seeded from AMPLAB_GRADING_SEED, a number
// scripts/grade draws for each grading run, so the two runs draw the same inputs and weights, and
// a submission cannot know them before it runs.
void start_test();
// A frame other than an observation (the student's main reports its test's events this way).
void write_event(char type, const std::string& payload);
// The judge's main, as a test ends: why the student's run does not match the judge's beyond the
// checks made ("" when every observation was checked).
std::string unconsumed();

}  // namespace amplab::test::judged
