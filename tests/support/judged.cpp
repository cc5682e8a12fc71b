// Observations of a graded test's checks: written by the student's process, judged by the
// reference's (see judged.hpp). The stream is a sequence of frames, each
//   u32 length (of what follows) | u8 type | payload
// with 'O' the observations and the other types the test's events, which scripts/grade reads
// (tests/grading/student_main.cpp). Numbers are in this machine's byte order: both processes run
// on the machine that grades.
#include "judged.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <sstream>

#include "support.hpp"

namespace amplab::test::judged {
namespace {

Role current_role = Role::plain;
int student_fd = -1;
bool student_computes_expected = false;
// Checks made on several threads at once (a test's rank threads): one frame, or one observation
// taken from the student's run, at a time.
std::mutex stream_mutex;

// A tensor of more elements than this crosses as an even sample of kSampled of them, from an
// offset the grading run's seed sets (the judge samples its own the same way), so that a check on
// an 8192 x 8192 activation, or a test that compares whole MNIST batches, stays a few MB.
constexpr int64_t kMaxElements = int64_t{1} << 18;
constexpr int64_t kSampled = int64_t{1} << 16;
constexpr size_t kMaxStreamBytes = size_t{1} << 30;

struct Observation {
  Kind kind{};
  std::string file;
  uint32_t line = 0;
  bool own_passed = false;
  std::vector<Operand> operands;
};

struct StudentRun {
  std::deque<Observation> observations;
  std::string unreadable;  // why the stream could not be read ("" when it could)
  size_t consumed = 0;
  bool desynchronized = false;
};
StudentRun student_run;

// ---- writing (the student's process) ------------------------------------------------------------

class Writer {
 public:
  void u8(uint8_t v) { bytes_.push_back(static_cast<char>(v)); }
  void u32(uint32_t v) { raw(&v, sizeof v); }
  void i64(int64_t v) { raw(&v, sizeof v); }
  void u64(uint64_t v) { raw(&v, sizeof v); }
  void f64(double v) { raw(&v, sizeof v); }
  void text(const std::string& v) {
    u32(static_cast<uint32_t>(v.size()));
    bytes_ += v;
  }
  void raw(const void* data, size_t n) { bytes_.append(static_cast<const char*>(data), n); }
  std::string& bytes() { return bytes_; }

 private:
  std::string bytes_;
};

void send_frame(char type, const std::string& payload) {
  if (student_fd < 0) return;
  std::lock_guard<std::mutex> lock(stream_mutex);  // a frame over PIPE_BUF is written in pieces
  Writer frame;
  frame.u32(static_cast<uint32_t>(payload.size() + 1));
  frame.u8(static_cast<uint8_t>(type));
  frame.bytes() += payload;
  const std::string& text = frame.bytes();
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(student_fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the grader stopped reading: nothing more to tell
    done += static_cast<size_t>(n);
  }
}

void write_operand(Writer& out, const Operand& value) {
  out.u8(static_cast<uint8_t>(value.tag));
  switch (value.tag) {
    case Operand::Tag::integer: out.i64(value.integer); break;
    case Operand::Tag::natural: out.u64(value.natural); break;
    case Operand::Tag::real: out.f64(value.real); break;
    case Operand::Tag::text:
    case Operand::Tag::opaque: out.text(value.text); break;
    case Operand::Tag::withheld: break;
    case Operand::Tag::tensor: {
      out.text(value.text);
      const torch::Tensor& t = value.tensor;
      out.u8(static_cast<uint8_t>(t.scalar_type()));
      out.u8(static_cast<uint8_t>(t.dim()));
      for (int64_t size : t.sizes()) out.i64(size);
      out.u64(static_cast<uint64_t>(t.nbytes()));
      out.raw(t.data_ptr(), t.nbytes());
      break;
    }
  }
}

// ---- reading (the judge's process) --------------------------------------------------------------

class Reader {
 public:
  Reader(const std::string& bytes, size_t begin, size_t end) : bytes_(bytes), at_(begin), end_(end) {}
  template <typename T>
  T number() {
    T v{};
    need(sizeof v);
    std::memcpy(&v, bytes_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  std::string text() {
    uint32_t n = number<uint32_t>();
    need(n);
    std::string v = bytes_.substr(at_, n);
    at_ += n;
    return v;
  }
  const char* take(size_t n) {
    need(n);
    const char* p = bytes_.data() + at_;
    at_ += n;
    return p;
  }
  bool done() const { return at_ == end_; }

 private:
  void need(size_t n) const {
    if (n > end_ - at_) throw std::runtime_error("a frame ends early");
  }
  const std::string& bytes_;
  size_t at_, end_;
};

Operand read_operand(Reader& in) {
  Operand v;
  v.tag = static_cast<Operand::Tag>(in.number<uint8_t>());
  switch (v.tag) {
    case Operand::Tag::integer: v.integer = in.number<int64_t>(); break;
    case Operand::Tag::natural: v.natural = in.number<uint64_t>(); break;
    case Operand::Tag::real: v.real = in.number<double>(); break;
    case Operand::Tag::text:
    case Operand::Tag::opaque: v.text = in.text(); break;
    case Operand::Tag::withheld: break;
    case Operand::Tag::tensor: {
      v.text = in.text();
      auto dtype = static_cast<c10::ScalarType>(in.number<uint8_t>());
      if (static_cast<int>(dtype) >= static_cast<int>(c10::ScalarType::NumOptions))
        throw std::runtime_error("a tensor of an unknown dtype");
      std::vector<int64_t> sizes(in.number<uint8_t>());
      int64_t numel = 1;
      for (auto& size : sizes) {
        size = in.number<int64_t>();
        if (size < 0 || size > (int64_t{1} << 40)) throw std::runtime_error("a tensor of a bad size");
        numel *= size;
      }
      const uint64_t nbytes = in.number<uint64_t>();
      const uint64_t element = c10::elementSize(dtype);
      if (numel > kMaxElements || nbytes != static_cast<uint64_t>(numel) * element)
        throw std::runtime_error("a tensor whose bytes do not match its size");
      const char* data = in.take(nbytes);
      v.tensor = torch::empty(sizes, torch::dtype(dtype));
      if (nbytes) std::memcpy(v.tensor.data_ptr(), data, nbytes);
      break;
    }
    default: throw std::runtime_error("an operand of an unknown kind");
  }
  return v;
}

Observation read_observation(Reader& in) {
  Observation o;
  o.kind = static_cast<Kind>(in.number<uint8_t>());
  o.line = in.number<uint32_t>();
  o.file = in.text();
  o.own_passed = in.number<uint8_t>() != 0;
  const uint8_t count = in.number<uint8_t>();
  if (count > 3) throw std::runtime_error("an observation with too many operands");
  for (uint8_t i = 0; i < count; ++i) o.operands.push_back(read_operand(in));
  if (!in.done()) throw std::runtime_error("an observation frame with bytes left over");
  return o;
}

void load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    student_run.unreadable = "the grader gave no observations of your run";
    return;
  }
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() > kMaxStreamBytes) {
    student_run.unreadable = "your run's observations are over 1 GB";
    return;
  }
  try {
    size_t at = 0;
    while (at < bytes.size()) {
      Reader header(bytes, at, bytes.size());
      const uint32_t length = header.number<uint32_t>();
      if (length == 0 || length > bytes.size() - at - 4) throw std::runtime_error("a frame ends early");
      const char type = bytes[at + 4];
      if (type == 'O') {
        Reader frame(bytes, at + 5, at + 4 + length);
        student_run.observations.push_back(read_observation(frame));
      }
      at += 4 + length;
    }
  } catch (const std::exception& e) {
    student_run.unreadable = std::string("your run's observations are damaged (") + e.what() + ")";
  }
}

// ---- the checks, on operands from either process ------------------------------------------------

bool is_number(const Operand& v) {
  return v.tag == Operand::Tag::integer || v.tag == Operand::Tag::natural || v.tag == Operand::Tag::real;
}

std::string show(const Operand& v) {
  std::ostringstream out;
  switch (v.tag) {
    case Operand::Tag::integer: out << v.integer; break;
    case Operand::Tag::natural: out << v.natural; break;
    case Operand::Tag::real: out.precision(17); out << v.real; break;
    case Operand::Tag::text: out << '"' << v.text.substr(0, 200) << (v.text.size() > 200 ? "...\"" : "\""); break;
    case Operand::Tag::opaque: out << v.text; break;
    case Operand::Tag::withheld: out << "(not computed in your process)"; break;
    case Operand::Tag::tensor: out << "tensor " << v.tensor.scalar_type() << v.tensor.sizes() << v.text; break;
  }
  return out.str();
}

// -1, 0, 1, or 2 when unordered (a NaN).
int order(const Operand& a, const Operand& b) {
  if (a.tag != Operand::Tag::real && b.tag != Operand::Tag::real) {
    auto wide = [](const Operand& v) -> __int128 {
      return v.tag == Operand::Tag::integer ? __int128{v.integer} : static_cast<__int128>(v.natural);
    };
    __int128 x = wide(a), y = wide(b);
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  auto real = [](const Operand& v) -> long double {
    return v.tag == Operand::Tag::real ? v.real : (v.tag == Operand::Tag::integer ? v.integer : v.natural);
  };
  long double x = real(a), y = real(b);
  if (std::isnan(x) || std::isnan(y)) return 2;
  return x < y ? -1 : (x > y ? 1 : 0);
}

double as_double(const Operand& v) {
  return v.tag == Operand::Tag::real ? v.real
                                     : (v.tag == Operand::Tag::integer ? static_cast<double>(v.integer)
                                                                       : static_cast<double>(v.natural));
}

bool holds(Kind kind, const Operand& a, const Operand& b, double tolerance, double rtol) {
  switch (kind) {
    case Kind::eq: return order(a, b) == 0;
    case Kind::ne: return order(a, b) != 0;
    case Kind::lt: return order(a, b) == -1;
    case Kind::le: return order(a, b) == -1 || order(a, b) == 0;
    case Kind::gt: return order(a, b) == 1;
    case Kind::ge: return order(a, b) == 1 || order(a, b) == 0;
    case Kind::near: return std::fabs(as_double(a) - as_double(b)) <= tolerance;
    case Kind::double_eq: {
      using Fp = ::testing::internal::FloatingPoint<double>;
      return Fp(as_double(a)).AlmostEquals(Fp(as_double(b)));
    }
    case Kind::tensors_close:
      return a.tag == Operand::Tag::tensor && b.tag == Operand::Tag::tensor && a.text == b.text &&
             detail::tensors_close(a.tensor, b.tensor, rtol, tolerance);
    case Kind::tensors_equal:
      return a.tag == Operand::Tag::tensor && b.tag == Operand::Tag::tensor && a.text == b.text &&
             detail::tensors_equal(a.tensor, b.tensor);
    case Kind::throws: {
      if (a.tag != Operand::Tag::text) return false;  // it did not throw
      std::istringstream parts(b.text);
      for (std::string part; std::getline(parts, part);)
        if (a.text.find(part) == std::string::npos) return false;
      return true;
    }
    default: return false;
  }
}

// For tensors: where the two differ first (": ..."), as the test's own comparison says it.
std::string why_not(Kind kind, const Operand& a, const Operand& b, double tolerance, double rtol) {
  if (a.tag != Operand::Tag::tensor || b.tag != Operand::Tag::tensor) return " (" + show(a) + " against " + show(b) + ")";
  auto result = kind == Kind::tensors_close ? detail::tensors_close(a.tensor, b.tensor, rtol, tolerance)
                                            : detail::tensors_equal(a.tensor, b.tensor);
  return std::string(": ") + result.message();
}

bool identical(const Operand& a, const Operand& b) {
  if (a.tag != b.tag) return false;
  if (is_number(a)) return a.integer == b.integer && a.natural == b.natural &&
                           std::memcmp(&a.real, &b.real, sizeof a.real) == 0;
  if (a.tag == Operand::Tag::tensor) return a.text == b.text && detail::tensors_equal(a.tensor, b.tensor);
  return a.text == b.text;
}

// The verdict on the student's observation `theirs` of the check the judge made with `mine`.
::testing::AssertionResult decide(const Observation& theirs, const Observation& mine, const ::testing::AssertionResult& own,
                                  double tolerance, double rtol) {
  const auto& s = theirs.operands;
  const auto& m = mine.operands;
  auto fail = [&](const std::string& why) {
    std::ostringstream out;
    out << "judged outside your process: " << why << "\n  your run's operands:";
    for (const auto& v : s) out << " " << show(v);
    out << "\n  the check, as the reference's run made it: " << own.message();
    return ::testing::AssertionFailure() << out.str();
  };
  if (theirs.kind == Kind::truth || theirs.kind == Kind::falsity) {
    const int64_t wanted = theirs.kind == Kind::truth ? 1 : 0;
    if (s[0].integer != wanted) return fail("the condition is not what the check needs in your run");
    if (!own) return fail("the condition, computed here from your run's values, does not hold");
    return ::testing::AssertionSuccess();
  }
  if (s.size() == 2 && s[1].tag == Operand::Tag::withheld) {  // the expected side exists here only
    if (!holds(theirs.kind, s[0], m[1], tolerance, rtol))
      return fail("your run's value does not meet the check against the reference run's expected value" +
                  why_not(theirs.kind, s[0], m[1], tolerance, rtol));
    return ::testing::AssertionSuccess();
  }
  for (const auto& v : s)
    if (v.tag == Operand::Tag::opaque)  // addresses: only the student's process can compare them
      return theirs.own_passed ? ::testing::AssertionSuccess() : fail("the check fails in your run");
  const bool numbers = std::all_of(s.begin(), s.end(), is_number) && std::all_of(m.begin(), m.end(), is_number);
  const bool tensors = theirs.kind == Kind::tensors_close || theirs.kind == Kind::tensors_equal || theirs.kind == Kind::throws;
  if (numbers || tensors) {
    if (!holds(theirs.kind, s[0], s[1], tolerance, rtol)) return fail("the check fails on your run's values");
    if (!holds(theirs.kind, s[0], m[1], tolerance, rtol))
      return fail("your run's first operand does not meet the check against the reference run's second" +
                  why_not(theirs.kind, s[0], m[1], tolerance, rtol));
    if (theirs.kind != Kind::throws && !holds(theirs.kind, m[0], s[1], tolerance, rtol))
      return fail("the reference run's first operand does not meet the check against your run's second" +
                  why_not(theirs.kind, m[0], s[1], tolerance, rtol));
    return ::testing::AssertionSuccess();
  }
  for (size_t i = 0; i < s.size(); ++i)  // sizes, strings, dtypes: the same as the reference run's
    if (!identical(s[i], m[i]))
      return fail("operand " + std::to_string(i + 1) + " differs from the reference run's (" + show(m[i]) + ")");
  return own ? ::testing::AssertionSuccess() : fail("the check fails");
}

}  // namespace

Role role() { return current_role; }

bool computes_expected() { return current_role != Role::student || student_computes_expected; }

void become_student(int fd, bool computes_expected) {
  current_role = Role::student;
  student_fd = fd;
  student_computes_expected = computes_expected;
}

void become_judge(const std::string& observations_file) {
  current_role = Role::judge;
  load(observations_file);
}

void write_event(char type, const std::string& payload) { send_frame(type, payload); }

void start_test() {
  if (const char* seed = std::getenv("AMPLAB_GRADING_SEED")) torch::manual_seed(std::strtoull(seed, nullptr, 10));
}

std::string unconsumed() {
  if (current_role != Role::judge || student_run.desynchronized || !student_run.unreadable.empty()) return "";
  if (student_run.observations.empty()) return "";
  return "your run made " + std::to_string(student_run.observations.size()) +
         " check(s) more than the reference's run of this test";
}

Operand tensor_operand(const torch::Tensor& value) {
  Operand out;
  out.tag = Operand::Tag::tensor;
  torch::Tensor t = value.detach();  // sampled where it lies: a GPU tensor of 100 M floats is not copied whole
  if (t.numel() > kMaxElements) {
    std::ostringstream sizes;
    sizes << " sampled from " << t.sizes();
    out.text = sizes.str();
    const int64_t stride = t.numel() / kSampled;
    const char* seed = std::getenv("AMPLAB_GRADING_SEED");
    const int64_t offset = seed ? static_cast<int64_t>(std::strtoull(seed, nullptr, 10) % stride) : 0;
    t = t.flatten().slice(0, offset, t.numel(), stride).slice(0, 0, kSampled);
  }
  out.tensor = t.cpu().contiguous();
  return out;
}

::testing::AssertionResult observe(Kind kind, const char* file, int line, std::vector<Operand> operands,
                                   ::testing::AssertionResult own, double tolerance, double rtol,
                                   bool expected_as_function) {
  Observation mine{kind, file, static_cast<uint32_t>(line), static_cast<bool>(own), std::move(operands)};
  if (current_role == Role::student) {
    Writer out;
    out.u8(static_cast<uint8_t>(kind));
    out.u32(mine.line);
    out.text(mine.file);
    out.u8(mine.own_passed ? 1 : 0);
    out.u8(static_cast<uint8_t>(mine.operands.size()));
    for (const auto& v : mine.operands) write_operand(out, v);
    send_frame('O', out.bytes());
    return own;
  }
  if (current_role != Role::judge) return own;
  std::unique_lock<std::mutex> lock(stream_mutex);
  if (!student_run.unreadable.empty()) return ::testing::AssertionFailure() << student_run.unreadable;
  if (student_run.desynchronized) return ::testing::AssertionFailure() << "(after the difference above)";
  ++student_run.consumed;
  if (student_run.observations.empty()) {
    student_run.desynchronized = true;
    return ::testing::AssertionFailure() << "your run ended before this check (check " << student_run.consumed
                                         << " of the test)";
  }
  Observation theirs = std::move(student_run.observations.front());
  student_run.observations.pop_front();
  if (theirs.kind != kind || theirs.line != mine.line || theirs.file != mine.file ||
      theirs.operands.size() != mine.operands.size()) {
    student_run.desynchronized = true;
    return ::testing::AssertionFailure() << "your run took another path through the test: its check "
                                         << student_run.consumed << " is at " << theirs.file << ":" << theirs.line
                                         << ", the reference's at " << file << ":" << line;
  }
  // Only the expected side of a tensor check that gives it as a function may be withheld.
  const bool withheld_expected = expected_as_function &&
                                 (kind == Kind::tensors_close || kind == Kind::tensors_equal) &&
                                 theirs.operands.size() == 2 && theirs.operands[1].tag == Operand::Tag::withheld &&
                                 mine.operands[1].tag == Operand::Tag::tensor;
  for (size_t i = 0; i < mine.operands.size() && kind != Kind::throws; ++i)
    if (theirs.operands[i].tag != mine.operands[i].tag && !(is_number(theirs.operands[i]) && is_number(mine.operands[i])) &&
        !(withheld_expected && i == 1)) {
      student_run.desynchronized = true;
      return ::testing::AssertionFailure() << "your run's check at " << file << ":" << line << " has operands of other kinds";
    }
  lock.unlock();
  return decide(theirs, mine, own, tolerance, rtol);
}

}  // namespace amplab::test::judged
