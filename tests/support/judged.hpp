// Assertions judged outside the student's process (included at the end of support.hpp).
//
// A graded test runs twice when scripts/grade grades it. First in the student's process (the
// student's code for the TODO, the reference in every other hole): every check the test makes is
// an *observation* written to the grader (its kind, where it is, and its operands' values). Then
// in the judge's process, a binary linked with the reference only, which runs the same test with
// the same inputs and, at each check, reads the student's observation of it and decides:
//   - the check holds on the student's own operands (what the student's run saw);
//   - it holds with each of the student's operands put against the judge's other one: an output
//     of the student's code must satisfy the check against the value the reference's run computed
//     (for `EXPECT_EQ(scale, 65536)`: the student's scale against the judge's 65536, and the judge's
//     scale against the student's 65536, so it does not matter which side is the student's);
//   - operands that are not numbers or tensors (sizes, strings, dtypes) must be identical to the
//     judge's; a bare condition (EXPECT_TRUE on a bool) is the student's word only;
//   - a tensor check whose expected side is a function (support.hpp) has no expected side in the
//     student's process at all: the student's actual side must meet the check against the judge's.
//     So the answer is never in the memory of the process that runs the student's code.
// So the student's process can report its values, not its verdict: to pass it must hand over the
// values the reference computes. In a plain run (ctest) nothing of this happens: the macros below
// are gtest's own checks with the same messages.
#pragma once

#include <gtest/gtest.h>
#include <torch/types.h>

#include "judged_role.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace amplab::test::judged {

enum class Kind : uint8_t { eq = 1, ne, lt, le, gt, ge, near, double_eq, truth, falsity, tensors_close, tensors_equal,
                            throws };

// One operand as data: what crosses from the student's process to the judge's.
struct Operand {
  // withheld: the expected side of a tensor check, which a graded student's process does not compute
  // (the judge compares the student's actual side against its own expected side).
  enum class Tag : uint8_t { integer = 'i', natural = 'u', real = 'f', text = 's', opaque = 'p', tensor = 't',
                             withheld = 'w' };
  Tag tag = Tag::opaque;
  int64_t integer = 0;
  uint64_t natural = 0;
  double real = 0;
  std::string text;      // text, or an opaque value's printout (a pointer: meaningful in its own process only)
  torch::Tensor tensor;  // on the CPU, contiguous
};

Operand tensor_operand(const torch::Tensor& value);

template <typename T>
Operand operand(const T& value) {
  using U = std::decay_t<T>;
  Operand out;
  if constexpr (std::is_same_v<U, bool>) {
    out.tag = Operand::Tag::integer;
    out.integer = value ? 1 : 0;
  } else if constexpr (std::is_enum_v<U>) {
    out.tag = Operand::Tag::integer;
    out.integer = static_cast<int64_t>(value);
  } else if constexpr (std::is_integral_v<U> && std::is_signed_v<U>) {
    out.tag = Operand::Tag::integer;
    out.integer = static_cast<int64_t>(value);
  } else if constexpr (std::is_integral_v<U>) {
    out.tag = Operand::Tag::natural;
    out.natural = static_cast<uint64_t>(value);
  } else if constexpr (std::is_floating_point_v<U>) {
    out.tag = Operand::Tag::real;
    out.real = static_cast<double>(value);
  } else if constexpr (std::is_same_v<U, std::string> || std::is_same_v<U, std::string_view>) {
    out.tag = Operand::Tag::text;
    out.text = std::string(value);
  } else if constexpr (std::is_array_v<std::remove_reference_t<T>> &&
                       std::is_same_v<std::remove_cv_t<std::remove_extent_t<std::remove_reference_t<T>>>, char>) {
    out.tag = Operand::Tag::text;  // a string literal: its characters, as gtest compares it with a std::string
    out.text = std::string(value);
  } else if constexpr (std::is_pointer_v<U> || std::is_null_pointer_v<U>) {
    out.tag = Operand::Tag::opaque;  // an address means nothing in another process
    out.text = ::testing::PrintToString(value);
  } else if constexpr (std::is_same_v<U, torch::Tensor>) {
    return tensor_operand(value);
  } else {
    out.tag = Operand::Tag::text;
    out.text = ::testing::PrintToString(value);
  }
  return out;
}

// The result gtest reports for one check: `own` (gtest's own verdict on this process's operands)
// in a plain run; in a student run `own` after the observation is written; in a judge run the
// verdict on the student's observation (see the top of this file). `expected_as_function`: the
// check's expected side was given as a function, the one case where the student's process may
// withhold it (for any other check a withheld operand would skip the judge's only look at it).
::testing::AssertionResult observe(Kind kind, const char* file, int line, std::vector<Operand> operands,
                                   ::testing::AssertionResult own, double tolerance = 0, double rtol = 0,
                                   bool expected_as_function = false);

template <Kind kind, typename A, typename B>
::testing::AssertionResult compare(const char* file, int line, const char* ea, const char* eb, const A& a, const B& b) {
  namespace gi = ::testing::internal;
  ::testing::AssertionResult own = [&] {
    if constexpr (kind == Kind::eq) return gi::EqHelper::Compare(ea, eb, a, b);
    if constexpr (kind == Kind::ne) return gi::CmpHelperNE(ea, eb, a, b);
    if constexpr (kind == Kind::lt) return gi::CmpHelperLT(ea, eb, a, b);
    if constexpr (kind == Kind::le) return gi::CmpHelperLE(ea, eb, a, b);
    if constexpr (kind == Kind::gt) return gi::CmpHelperGT(ea, eb, a, b);
    if constexpr (kind == Kind::ge) return gi::CmpHelperGE(ea, eb, a, b);
  }();
  if (role() == Role::plain) return own;
  return observe(kind, file, line, {operand(a), operand(b)}, own);
}

inline ::testing::AssertionResult near(const char* file, int line, const char* ea, const char* eb, const char* et,
                                       double a, double b, double tolerance) {
  auto own = ::testing::internal::DoubleNearPredFormat(ea, eb, et, a, b, tolerance);
  if (role() == Role::plain) return own;
  return observe(Kind::near, file, line, {operand(a), operand(b)}, own, tolerance);
}

inline ::testing::AssertionResult double_eq(const char* file, int line, const char* ea, const char* eb, double a,
                                            double b) {
  auto own = ::testing::internal::CmpHelperFloatingPointEQ<double>(ea, eb, a, b);
  if (role() == Role::plain) return own;
  return observe(Kind::double_eq, file, line, {operand(a), operand(b)}, own);
}

// EXPECT_TRUE / EXPECT_FALSE: a bool, or an AssertionResult (its message kept).
template <typename T>
::testing::AssertionResult truth(bool wanted, const char* file, int line, const char* expression, const T& value) {
  const bool got = static_cast<bool>(value);
  ::testing::AssertionResult own = ::testing::AssertionSuccess();
  if (got != wanted) {
    own = ::testing::AssertionFailure() << "Value of: " << expression << "\n  Actual: " << (got ? "true" : "false");
    if constexpr (std::is_same_v<std::decay_t<T>, ::testing::AssertionResult>) {
      if (value.message()[0] != '\0') own << " (" << value.message() << ")";
    }
    own << "\nExpected: " << (wanted ? "true" : "false");
  } else if constexpr (std::is_same_v<std::decay_t<T>, ::testing::AssertionResult>) {
    own << value.message();
  }
  if (role() == Role::plain) return own;
  return observe(wanted ? Kind::truth : Kind::falsity, file, line, {operand(got)}, own);
}

}  // namespace amplab::test::judged

// gtest's comparison macros, each routed through the functions above (same arity, same messages,
// `<< extra` still streams into the failure).
#define AMPLAB_JUDGED_CMP_(kind, a, b, on_failure)                                                             \
  GTEST_ASSERT_(::amplab::test::judged::compare<::amplab::test::judged::Kind::kind>(__FILE__, __LINE__, #a, #b, a, b), \
                on_failure)
#undef EXPECT_EQ
#undef EXPECT_NE
#undef EXPECT_LT
#undef EXPECT_LE
#undef EXPECT_GT
#undef EXPECT_GE
#undef ASSERT_EQ
#undef ASSERT_NE
#undef ASSERT_LT
#undef ASSERT_LE
#undef ASSERT_GT
#undef ASSERT_GE
#undef EXPECT_NEAR
#undef ASSERT_NEAR
#undef EXPECT_DOUBLE_EQ
#undef ASSERT_DOUBLE_EQ
#undef EXPECT_TRUE
#undef EXPECT_FALSE
#undef ASSERT_TRUE
#undef ASSERT_FALSE
#define EXPECT_EQ(a, b) AMPLAB_JUDGED_CMP_(eq, a, b, GTEST_NONFATAL_FAILURE_)
#define EXPECT_NE(a, b) AMPLAB_JUDGED_CMP_(ne, a, b, GTEST_NONFATAL_FAILURE_)
#define EXPECT_LT(a, b) AMPLAB_JUDGED_CMP_(lt, a, b, GTEST_NONFATAL_FAILURE_)
#define EXPECT_LE(a, b) AMPLAB_JUDGED_CMP_(le, a, b, GTEST_NONFATAL_FAILURE_)
#define EXPECT_GT(a, b) AMPLAB_JUDGED_CMP_(gt, a, b, GTEST_NONFATAL_FAILURE_)
#define EXPECT_GE(a, b) AMPLAB_JUDGED_CMP_(ge, a, b, GTEST_NONFATAL_FAILURE_)
#define ASSERT_EQ(a, b) AMPLAB_JUDGED_CMP_(eq, a, b, GTEST_FATAL_FAILURE_)
#define ASSERT_NE(a, b) AMPLAB_JUDGED_CMP_(ne, a, b, GTEST_FATAL_FAILURE_)
#define ASSERT_LT(a, b) AMPLAB_JUDGED_CMP_(lt, a, b, GTEST_FATAL_FAILURE_)
#define ASSERT_LE(a, b) AMPLAB_JUDGED_CMP_(le, a, b, GTEST_FATAL_FAILURE_)
#define ASSERT_GT(a, b) AMPLAB_JUDGED_CMP_(gt, a, b, GTEST_FATAL_FAILURE_)
#define ASSERT_GE(a, b) AMPLAB_JUDGED_CMP_(ge, a, b, GTEST_FATAL_FAILURE_)
#define EXPECT_NEAR(a, b, tolerance) \
  GTEST_ASSERT_(::amplab::test::judged::near(__FILE__, __LINE__, #a, #b, #tolerance, a, b, tolerance), GTEST_NONFATAL_FAILURE_)
#define ASSERT_NEAR(a, b, tolerance) \
  GTEST_ASSERT_(::amplab::test::judged::near(__FILE__, __LINE__, #a, #b, #tolerance, a, b, tolerance), GTEST_FATAL_FAILURE_)
#define EXPECT_DOUBLE_EQ(a, b) \
  GTEST_ASSERT_(::amplab::test::judged::double_eq(__FILE__, __LINE__, #a, #b, a, b), GTEST_NONFATAL_FAILURE_)
#define ASSERT_DOUBLE_EQ(a, b) \
  GTEST_ASSERT_(::amplab::test::judged::double_eq(__FILE__, __LINE__, #a, #b, a, b), GTEST_FATAL_FAILURE_)
#define EXPECT_TRUE(condition) \
  GTEST_ASSERT_(::amplab::test::judged::truth(true, __FILE__, __LINE__, #condition, condition), GTEST_NONFATAL_FAILURE_)
#define EXPECT_FALSE(condition) \
  GTEST_ASSERT_(::amplab::test::judged::truth(false, __FILE__, __LINE__, #condition, condition), GTEST_NONFATAL_FAILURE_)
#define ASSERT_TRUE(condition) \
  GTEST_ASSERT_(::amplab::test::judged::truth(true, __FILE__, __LINE__, #condition, condition), GTEST_FATAL_FAILURE_)
#define ASSERT_FALSE(condition) \
  GTEST_ASSERT_(::amplab::test::judged::truth(false, __FILE__, __LINE__, #condition, condition), GTEST_FATAL_FAILURE_)
