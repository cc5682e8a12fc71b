"""scripts/find-long-functions.py finds every function of a C++ file with its first and last line,
whatever braces its comments, strings, characters, raw strings and #else branches hold, and its
exit status says whether one is too long. ctest: find_long_functions_parses (label core)."""
import importlib.util
import pathlib
import subprocess
import sys
import tempfile
import textwrap
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "find-long-functions.py"
spec = importlib.util.spec_from_file_location("find_long_functions", SCRIPT)
flf = importlib.util.module_from_spec(spec)
spec.loader.exec_module(flf)

TRICKY = textwrap.dedent(r'''
    #include <string>
    namespace a::b {
    namespace {
    const char* kBraces = "{ \" {";   // { in a comment
    const char kOpen = '{';
    /* { */ const std::string kRaw = R"x(  } { )" }  )x";
    constexpr long kBig = 1'000'000;
    const int kTable[] = {1, 2, {3}};
    struct Pair { int x{0}; int y = 1; };
    }  // namespace

    int plain(int x) {
      if (x > 0) {
        return '}';
      }
      return x;
    }

    template <typename T, int N = 3>
    auto trailing(T t) -> std::vector<T> {
      return {t};
    }

    class Widget : public Base<int> {
     public:
      Widget(int a, int b) : a_{a}, b_(b) {
        auto f = [&](int c) { return c + a_; };
        f(1);
      }
      int get() const noexcept { return a_; }
      bool operator==(const Widget& o) const { return a_ == o.a_; }
      int operator()(int x) const { return x; }
     private:
      int a_, b_;
    };

    Widget::~Widget() {
    #if FAST
      if (a_) {
    #else
      if (b_) {
    #endif
        a_ = 0;
      }
    }

    extern "C" {
    void c_api(void) {
    }
    }

    auto namespace_lambda = [](int x) {
      return x;
    };

    TEST(Suite, Name) {
      EXPECT_TRUE(true);
    }
    }  // namespace a::b
    ''').lstrip("\n")


class FindLongFunctions(unittest.TestCase):
    def test_finds_every_function_with_its_lines(self):
        found = {name: (first, last) for name, first, last in flf.functions(TRICKY)}
        lines = TRICKY.splitlines()

        def span(start, end="}"):  # the first line that starts with `start`, to the next that is `end`
            first = next(i for i, line in enumerate(lines) if line.strip().startswith(start)) + 1
            if end is None:
                return first, first
            return first, next(i for i in range(first - 1, len(lines)) if lines[i] == end) + 1

        self.assertEqual(found, {
            "plain": span("int plain"),
            "trailing": span("template <typename T, int N = 3>"),
            "Widget": span("Widget(int a", "  }"),
            "get": span("int get() const noexcept { return a_; }", None),
            "operator==": span("bool operator==(const Widget& o) const { return a_ == o.a_; }", None),
            "operator()": span("int operator()(int x) const { return x; }", None),
            "Widget::~Widget": span("Widget::~Widget"),
            "c_api": span("void c_api"),
            "namespace_lambda (lambda)": span("auto namespace_lambda", "};"),
            "TEST(Suite, Name)": span("TEST(Suite, Name)"),
        })

    def test_exit_status_and_report(self):
        with tempfile.TemporaryDirectory() as tmp:
            source = pathlib.Path(tmp) / "long.cpp"
            source.write_text("int f() {\n" + "  g();\n" * 8 + "}\nint h() { return 1; }\n")
            run = lambda *args: subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)
            too_long = run("-n", "9", tmp)
            self.assertEqual(too_long.returncode, 1, too_long.stderr)
            self.assertEqual(too_long.stdout, f"{source}:1-10: f: 10 lines\n")
            self.assertEqual(run("-n", "10", str(source)).returncode, 0)
            source.write_text("void f() {\n  if (x) {\n}\n")
            unbalanced = run(str(source))
            self.assertEqual(unbalanced.returncode, 1)
            self.assertIn("found no closing brace for the end of f (line 1)", unbalanced.stderr)
            self.assertEqual(run(str(pathlib.Path(tmp) / "missing.cpp")).returncode, 2)

    def test_this_checkout_parses(self):
        # Every C++ file here parses (braces balance after blanking): a failure names the file.
        result = subprocess.run([sys.executable, str(SCRIPT), "-n", "100000", *(str(ROOT / d) for d in
                                 ("src", "apps", "labs", "solution", "starter", "tests", "bench") if (ROOT / d).is_dir())],
                                capture_output=True, text=True)
        self.assertEqual(result.returncode, 0, result.stderr)


if __name__ == "__main__":
    unittest.main()
