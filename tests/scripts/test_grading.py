"""Unit tests of the grading scripts' pieces (rubric parsing and checks, gtest report parsing,
the student-file sync of scripts/grade). ctest: grading_scripts (label core)."""
import contextlib
import importlib.machinery
import io
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import types
import unittest
import unittest.mock

SCRIPTS = pathlib.Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import amplab_rubric as rubric  # noqa: E402

_loader = importlib.machinery.SourceFileLoader("grade", str(SCRIPTS / "grade"))
grade = importlib.util.module_from_spec(importlib.util.spec_from_loader("grade", _loader))
_loader.exec_module(grade)


def write(dir_, name, text):
    path = pathlib.Path(dir_) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


class RubricFiles(unittest.TestCase):
    def load(self, text):
        with tempfile.TemporaryDirectory() as tmp:
            return rubric.load_rubric(write(tmp, "rubric.yaml", text), "x")

    def test_defaults_apply_and_entries_override(self):
        tests = self.load("""
            lab: x
            defaults: {time_limit_s: 30, visibility: hidden}
            tests:
              - {test: A.B, todo: x-1, points: 2}
              - {test: A.C_CUDA, todo: x-2, points: 1.5, gpus: 1, time_limit_s: 90, also_needs: [x-1]}
            """)
        self.assertEqual([(t.test, t.time_limit_s, t.visibility, t.gpus) for t in tests],
                         [("A.B", 30, "hidden", 0), ("A.C_CUDA", 90, "hidden", 1)])
        self.assertEqual(tests[1].todos, ["x-2", "x-1"])

    def test_errors_name_the_entry_and_what_is_allowed(self):
        cases = {
            "lab: x\ntests:\n  - {test: A.B, todo: x-1, points: 2, visiblity: hidden}\n": "unknown key 'visiblity'",
            "lab: x\ntests:\n  - {test: A.B, todo: x-1}\n": "'points' is missing",
            "lab: x\ntests:\n  - {test: A.B, todo: x-1, points: -1}\n": "'points' must be a number >= 0",
            "lab: x\ntests:\n  - {test: A.B, todo: y-1, points: 1}\n": "not of the form x-<n>",
            "lab: x\ntests:\n  - {test: A.B, todo: x-1, points: 1, visibility: secret}\n": "not one of visible",
            "lab: y\ntests:\n  - {test: A.B, todo: y-1, points: 1}\n": "lab 'y' where 'x' was expected",
        }
        for text, message in cases.items():
            with self.assertRaises(rubric.RubricError) as caught:
                self.load(text)
            self.assertIn(message, str(caught.exception))
            self.assertIn("rubric.yaml", str(caught.exception))

    def test_problems(self):
        tests = self.load("""
            lab: x
            tests:
              - {test: A.B, todo: x-1, points: 1}
              - {test: A.B, todo: x-1, points: 1}
              - {test: A.Gone, todo: x-9, points: 1}
              - {test: A.D_CUDA, todo: x-1, points: 1}
            """)
        found = "\n".join(rubric.problems("x", tests, ["x-1", "x-2"], ["A.B", "A.D_CUDA", "A.New"]))
        for part in ("A.B: in the rubric twice", "TODO 'x-9' is not in the code", "A.D_CUDA: named *_CUDA",
                     "A.Gone: in the rubric", "TODO x-2 has no test", "A.New: a graded test with no rubric entry"):
            self.assertIn(part, found)
        self.assertEqual(rubric.problems("x", tests[:1], ["x-1"], ["A.B"]), [])


class OutcomesAndScores(unittest.TestCase):
    def test_first_line(self):
        self.assertEqual(rubric.first_line('unknown file\nC++ exception with description "TODO(mnist-2) is not '
                                           'implemented yet: fill in ..." thrown in the test body.'),
                         "TODO(mnist-2) is not implemented yet")
        self.assertEqual(rubric.first_line("/src/tests/labs/mnist_test.cpp:59\nExpected equality of these values:\n"
                                           "  calls\n    Which is: 3\n"),
                         "mnist_test.cpp:59: Expected equality of these values: calls Which is: 3")
        self.assertIn("Which is: 24 48", rubric.first_line(
            "/t/gpu_basics_test.cpp:150\nExpected equality of these values:\n  gpu_basics::matmul_flops(2, 3, 4)\n"
            "    Which is: 24\n  48\n"))

    def test_speed_tests_score_the_share_of_the_time_measured_outside(self):
        with tempfile.TemporaryDirectory() as tmp:
            tests = rubric.load_rubric(write(tmp, "rubric.yaml", """
                lab: x
                tests:
                  - {test: S.Fast_CUDA, todo: x-1, points: 4, gpus: 1, speed: {full_within: 1.2}}
                  - {test: S.Linear_CUDA, todo: x-1, points: 4, gpus: 2, speed: {full_within: 1.1, none_at: 2.0}}
                  - {test: S.Inside_CUDA, todo: x-1, points: 4, gpus: 2, partial: true, judged: inside}
                  - {test: S.Plain, todo: x-1, points: 2}
                """), "x")
        fast, linear, inside, plain = tests
        self.assertEqual(rubric.speed_share(fast.speed, 1.1), 1.0)
        self.assertAlmostEqual(rubric.speed_share(fast.speed, 2.4), 0.5)       # half the speed of 5/6 of it
        self.assertEqual(rubric.speed_share(linear.speed, 1.1), 1.0)
        self.assertAlmostEqual(rubric.speed_share(linear.speed, 1.55), 0.5)
        self.assertEqual(rubric.speed_share(linear.speed, 3.0), 0.0)
        passed = rubric.Outcome("passed", 1.0, fraction=0.75)
        self.assertEqual(rubric.score(fast, passed), 3.0)
        self.assertEqual(rubric.score(inside, passed), 3.0)
        self.assertEqual(rubric.score(fast, rubric.Outcome("passed", 1.0)), 0.0)  # no time measured: no share
        self.assertEqual(rubric.score(fast, rubric.Outcome("failed", 1.0, fraction=0.75)), 0)
        self.assertEqual(rubric.score(plain, passed), 2)

    def test_bad_speed_rules_are_refused(self):
        for entry, says in (("partial: 2", "'partial' must be true or false"),
                            ("partial: true", "only for a test judged inside"),
                            ("speed: {full_within: 0.5}", "1 <= R < N"),
                            ("speed: {full_within: 1.2, none_at: 1.1}", "1 <= R < N"),
                            ("speed: {within: 1.2}", "'speed' must be"),
                            ("speed: {full_within: 1.2}, judged: inside", "judged outside")):
            with self.subTest(entry=entry), tempfile.TemporaryDirectory() as tmp:
                with self.assertRaises(rubric.RubricError) as caught:
                    rubric.load_rubric(write(tmp, "rubric.yaml", f"lab: x\ntests:\n  - {{test: A.B, todo: x-1, "
                                                                 f"points: 1, {entry}}}\n"), "x")
                self.assertIn(says, str(caught.exception))


class SpeedFromOutside(unittest.TestCase):
    """scripts/grade times a speed test's processes itself: the student's share comes from wall
    times taken out there, never from what the student's process reports."""

    class Box:  # stands in for the sandbox: each run's wall time by the mode of its calls
        def __init__(self, seconds, failing=()):
            self.seconds, self.failing, self.modes = {k: list(v) for k, v in seconds.items()}, failing, []

        def run(self, argv, env, cwd, timeout_s, binaries, memory_mb=None):
            mode = env["AMPLAB_SPEED_CALLS"]
            self.modes.append(mode)
            return types.SimpleNamespace(seconds=self.seconds[mode].pop(0), mode=mode)

    def judge(self, box):
        return lambda run, token, test: grade.sandbox.Verdict(
            "failed" if run.mode in box.failing else "passed", "", [], None)

    def share(self, box, student_seconds):
        t = rubric.RubricTest(lab="x", test="S.Speed_CUDA", todo="x-1", points=4, gpus=1,
                              speed={"full_within": 1.2})
        with unittest.mock.patch.object(grade.sandbox, "judge", self.judge(box)):
            return grade.time_from_outside(box, t, {"AMPLAB_SPEED_CALLS": "calls"}, student_seconds,
                                           {"tests": "judge"}, "token", None)

    def test_the_share_is_the_students_calls_against_the_references_timed_outside(self):
        box = self.Box({"prepare": [6.50, 6.44], "calls": [11.70, 11.66]})
        share, message, spent = self.share(box, 16.17)  # twice the work: 1.86x the reference's time
        self.assertEqual(box.modes, ["prepare", "calls", "prepare", "calls"])  # taking turns
        self.assertAlmostEqual(share, 1.2 / ((16.17 - 6.44) / (11.66 - 6.44)))
        self.assertIn("1.86x the reference's time", message)
        self.assertAlmostEqual(spent, 6.50 + 6.44 + 11.70 + 11.66)
        share, _, _ = self.share(self.Box({"prepare": [6.5, 6.4], "calls": [11.7, 11.6]}), 11.9)
        self.assertEqual(share, 1.0)  # within 1.2x
        share, _, _ = self.share(self.Box({"prepare": [6.5, 6.4], "calls": [11.7, 11.6]}), 3.0)
        self.assertEqual(share, 1.0)  # faster than the reference's startup: no negative time

    def test_no_share_when_the_reference_cannot_be_timed(self):
        share, message, _ = self.share(self.Box({"prepare": [6.5], "calls": [11.7]}, failing=("prepare",)), 9.0)
        self.assertEqual(share, 0.0)
        self.assertIn("could not time the reference's calls", message)
        share, message, _ = self.share(self.Box({"prepare": [6.5, 6.4], "calls": [6.6, 6.7]}), 9.0)
        self.assertEqual(share, 0.0)
        self.assertIn("too little to time", message)


class StudentFiles(unittest.TestCase):
    def test_sync_rewrites_only_changed_files_and_removes_stale_ones(self):
        with tempfile.TemporaryDirectory() as tmp:
            a = write(tmp, "in/a.cpp", "int a;\n")
            b = write(tmp, "in/b.cpp", "int b;\n")
            dest = pathlib.Path(tmp) / "out"
            self.assertEqual(grade.sync_tree(dest, {"lab/a.cpp": a, "lab/b.cpp": b}), 2)
            self.assertEqual(grade.sync_tree(dest, {"lab/a.cpp": a, "lab/b.cpp": b}), 0)
            b.write_text("int b2;\n")
            self.assertEqual(grade.sync_tree(dest, {"lab/b.cpp": b}), 2)  # b rewritten, a removed
            self.assertEqual(sorted(p.name for p in (dest / "lab").iterdir()), ["b.cpp"])
            self.assertEqual((dest / "lab" / "b.cpp").read_text(), "int b2;\n")



# make-starter.py is an instructor's script: a student hand-out does not have it.
HAVE_MAKE_STARTER = (SCRIPTS / "make-starter.py").is_file()
if HAVE_MAKE_STARTER:
    _starter_loader = importlib.machinery.SourceFileLoader("make_starter", str(SCRIPTS / "make-starter.py"))
    make_starter = importlib.util.module_from_spec(importlib.util.spec_from_loader("make_starter", _starter_loader))
    _starter_loader.exec_module(make_starter)

SOLUTION = textwrap.dedent("""\
    int given() { return 1; }

    // TODO(lab-1): one.
    int one() {
      // BEGIN SOLUTION
      return 1;
      // END SOLUTION
    }

    // TODO(lab-2): two.
    int two(int x) {
      // BEGIN SOLUTION
      int y = x + 1;
      return y;
      // END SOLUTION
    }
    """)


class Certification(unittest.TestCase):
    """scripts/grade --certify: which variants it runs, and when the rubric is certified."""

    def test_a_test_runs_with_its_todos_together_and_each_alone(self):
        t = rubric.RubricTest(lab="lab", test="S.t", todo="lab-2", points=1, also_needs=["lab-1"])
        self.assertEqual(grade.todo_sets(t, certify=False), [["lab-1", "lab-2"]])
        self.assertEqual(grade.todo_sets(t, certify=True), [["lab-1", "lab-2"], ["lab-2"], ["lab-1"]])
        alone = rubric.RubricTest(lab="lab", test="S.u", todo="lab-3", points=1)
        self.assertEqual(grade.todo_sets(alone, certify=True), [["lab-3"]])  # no run twice

    def run_certify(self, statuses):
        t = rubric.RubricTest(lab="lab", test="S.t", todo="lab-1", points=1)
        results = [{"lab": "lab", "test": "S.t", "emptied": [todo], "status": status, "message": ""}
                   for todo, status in statuses]
        with contextlib.redirect_stdout(io.StringIO()) as out:
            code = grade.certify(results, {"lab": [t]}, {"lab": []}, 1.0)
        return code, out.getvalue()

    def test_a_test_that_passes_with_its_todo_empty_is_a_problem(self):
        code, out = self.run_certify([("lab-1", "passed")])
        self.assertEqual(code, 1)
        self.assertIn("S.t passes with lab-1 empty", out)

    def test_failing_every_run_certifies_and_a_gpu_test_is_listed_not_counted(self):
        code, out = self.run_certify([("lab-1", "failed"), ("lab-1", "needs_gpu")])
        self.assertEqual(code, 0, out)
        self.assertIn("not checked here", out)
        self.assertIn("the rubric is certified", out)

    def test_a_variant_that_does_not_build_is_a_problem(self):
        code, out = self.run_certify([("lab-1", "build_failed")])
        self.assertEqual(code, 1)
        self.assertIn("does not build", out)


@unittest.skipUnless(HAVE_MAKE_STARTER, "an instructor's script (not in a hand-out)")
class GradingVariants(unittest.TestCase):
    """make-starter.py's variant_text: the student's code in the chosen holes, the reference in the
    others, chosen when the file is written."""

    def variant(self, student, selected):
        return make_starter.variant_text(SOLUTION, "solution/lab/x.cpp", student, "starter/lab/x.cpp", selected)

    def test_the_graded_todos_reference_is_not_in_the_file(self):
        starter = make_starter.starter_text(SOLUTION, "solution/lab/x.cpp")
        student = starter.replace('  AMPLAB_TODO("lab-2");\n', "  return x * 2;\n")
        text = self.variant(student, {"lab-2"})
        self.assertIn("return x * 2;", text)
        self.assertNotIn("int y = x + 1;", text)  # lab-2's reference: absent
        self.assertIn("  return 1;\n", text)      # lab-1: the reference
        self.assertNotIn('AMPLAB_TODO("lab-1")', text)
        self.assertNotIn("amplab_student_todo", text)  # nothing to switch at run time
        self.assertIn('#line 6 "course-reference/x.cpp"', text)  # no instructor path in messages
        other = self.variant(student, {"lab-1"})
        self.assertIn('AMPLAB_TODO("lab-1");', other)  # their (empty) hole
        self.assertIn("int y = x + 1;", other)
        self.assertNotIn("return x * 2;", other)

    def test_a_marker_left_after_filled_code_is_still_the_students_hole(self):
        starter = make_starter.starter_text(SOLUTION, "solution/lab/x.cpp")
        student = starter.replace('  AMPLAB_TODO("lab-1");\n', '  return 7;\n  AMPLAB_TODO("lab-1");\n')
        text = self.variant(student, {"lab-1"})
        self.assertIn('  return 7;\n  AMPLAB_TODO("lab-1");\n', text)
        reference = self.variant(student, {"lab-2"})
        self.assertNotIn("return 7;", reference)  # all of it was recognised as the hole's code
        self.assertNotIn('AMPLAB_TODO("lab-1")', reference)

    def test_changed_given_code_around_a_hole_is_refused(self):
        starter = make_starter.starter_text(SOLUTION, "solution/lab/x.cpp")
        student = starter.replace("int two(int x) {", "int two(int x, int z = 0) {")
        with self.assertRaises(make_starter.MergeError) as caught:
            self.variant(student, {"lab-2"})
        self.assertIn("lab-2", str(caught.exception))


class Screening(unittest.TestCase):
    """amplab_screen: what a submission may not contain, found however it is written."""

    def test_reaching_outside_the_students_code_is_found(self):
        import amplab_screen
        text = textwrap.dedent('''\
            #include "../../solution/lab/x.cpp"
            %:include </etc/passwd>
            #define private public
            asm(".incbin \\"x\\"");
            a\\
            sm("nop");
            #define CAT(a, b) a##b
            int s = testing::UnitTest::GetInstance() != nullptr;
            __attribute__((constructor)) static void early() {}
            const char* fine = "asm ## testing::";  // asm in a comment is fine
            #include <torch/torch.h>
            #include "grad_scaler.hpp"
            ''')
        found = amplab_screen.screen(text)
        lines = sorted({int(f.split(":")[0].split()[1]) for f in found})
        self.assertEqual(lines, [1, 2, 3, 4, 5, 7, 8, 9])
        self.assertTrue(any("'..'" in f for f in found))

    def test_attributes_that_run_code_around_main_are_found_however_they_are_written(self):
        import amplab_screen
        text = textwrap.dedent('''\
            __attribute__((
                destructor)) static void late() {}
            __attribute((__constructor__)) static void early() {}
            [[gnu::
              section(".x")]] int placed;
            __attribute__ ((init_priority (101))) int ordered;
            __attribute__((unused)) static int fine;
            [[nodiscard]] int also_fine();
            int table[2]; int at = table[ [] { return 0; }() ];
            const char* text = "__attribute__((constructor))";
            ''')
        found = amplab_screen.screen(text)
        self.assertEqual([f.split(":")[0] for f in found], ["line 1", "line 3", "line 4", "line 6"], found)
        self.assertIn("'destructor'", found[0])


class Limits(unittest.TestCase):
    def test_only_a_failed_allocation_is_running_out_of_memory(self):
        import amplab_sandbox
        warning = ("[W1129 04:17:51 CUDAFunctions.cpp:119] Warning: CUDA initialization: Unexpected error from "
                   "cudaGetDeviceCount(). Error 2: out of memory (function operator())")
        self.assertFalse(amplab_sandbox.ran_out_of_memory(warning + "\n[  FAILED  ] A.b"))
        self.assertTrue(amplab_sandbox.ran_out_of_memory(warning + "\nterminate called: std::bad_alloc"))
        self.assertTrue(amplab_sandbox.ran_out_of_memory("CUDA error: out of memory"))


class Verdicts(unittest.TestCase):
    """amplab_sandbox.judge: the outcome comes from the token-carrying lines only."""

    def run_with(self, lines, code=0):
        import amplab_sandbox
        run = amplab_sandbox.Run(code=code, seconds=1.0, head=b"", tail=b"", total=0,
                                 stream="\n".join(lines).encode(), limits=[])
        return amplab_sandbox.judge(run, "tok", "A.b")

    def test_a_pass_needs_every_line_with_the_token(self):
        self.assertEqual(self.run_with(["tok main 1", "tok start A.b", "tok part success x", "tok end passed -"]).status,
                         "passed")
        self.assertEqual(self.run_with(["tok main 1", "tok start A.b", "tok end passed -"], code=1).status, "crashed")
        forged = self.run_with(["tok main 1", "tok start A.b", "x end passed -", "tok end passed -"])
        self.assertEqual((forged.status, "did not make" in forged.message), ("failed", True))

    def test_failures_sent_during_the_test_count_even_if_the_end_says_passed(self):
        verdict = self.run_with(["tok main 1", "tok start A.b", "tok part failure f.cpp:3\\nexpected 1", "tok end passed -"])
        self.assertEqual(verdict.status, "failed")
        self.assertEqual(verdict.failures, ["f.cpp:3\nexpected 1"])

    def test_start_up_exits_and_missing_tests_are_told_apart(self):
        self.assertIn("during start-up, before main()", self.run_with([], code=0).message)
        self.assertEqual(self.run_with(["tok main 0"]).status, "missing")
        self.assertIn("during the test", self.run_with(["tok main 1", "tok start A.b"], code=-9).message)


def frame(kind, payload=b""):
    payload = payload.encode() if isinstance(payload, str) else payload
    return (len(payload) + 1).to_bytes(4, "little") + kind.encode() + payload


class StudentReports(unittest.TestCase):
    """amplab_sandbox.student_verdict: the student's process reports; its failures count, its pass
    is a claim (the judge checks it), and a damaged stream proves nothing."""

    def verdict(self, stream, code=0):
        import amplab_sandbox
        run = amplab_sandbox.Run(code=code, seconds=1.0, head=b"", tail=b"", total=0, stream=stream, limits=[])
        return amplab_sandbox.student_verdict(run, "A.b")[0]

    def test_events(self):
        start = frame("M", "1") + frame("S", "A.b") + frame("O", b"\x01anything")
        self.assertEqual(self.verdict(start + frame("E", "p")).status, "passed")
        failed = self.verdict(start + frame("P", "fx.cpp:3\nexpected 1") + frame("E", "p"))
        self.assertEqual((failed.status, failed.failures), ("failed", ["x.cpp:3\nexpected 1"]))
        self.assertEqual(self.verdict(start, code=-9).status, "crashed")
        self.assertEqual(self.verdict(start + frame("E", "p"), code=3).status, "crashed")
        self.assertEqual(self.verdict(b"\xff\xff\xff\x7fgarbage").status, "crashed")
        self.assertEqual(self.verdict(frame("M", "0")).status, "missing")


class LexicalWholeness(unittest.TestCase):
    """The reference goes into a variant only where the student's code before it leaves the same
    lexical state as the course's: never inside a string, a comment or a macro's arguments."""

    def state(self, text):
        import amplab_screen
        return amplab_screen.lexical_state(text)

    def test_states(self):
        self.assertEqual(self.state('int f() {\n  int n = 1\'000; auto s = R"x(a)x"; // (\n'), ("code", ("{",), False))
        self.assertEqual(self.state('int f() {\n  TORCH_CHECK(false && ({\n')[1], ("{", "(", "(", "{"))
        self.assertEqual(self.state('auto s = R"x(\n')[0], "raw string")
        self.assertEqual(self.state('/* open\n')[0], "block")
        self.assertEqual(self.state('#include <a> \\\n')[2], True)

    @unittest.skipUnless(HAVE_MAKE_STARTER, "an instructor's script (not in a hand-out)")
    def test_a_hole_left_open_makes_the_file_graded_as_a_whole(self):
        starter = make_starter.starter_text(SOLUTION, "solution/lab/x.cpp")
        for opener, closer in (('const char* leak = R"q(\n', ')q";\n'), ("/*\n", "*/\n"),
                               ("static int z = sizeof((\n", "));\n")):
            student = starter.replace("int two(int x) {", opener + "int two(int x) {")
            lines = student.splitlines(keepends=True)
            at = next(i for i, line in enumerate(lines) if line.startswith("int two"))
            end = next(i for i in range(at, len(lines)) if lines[i].rstrip() == "}")
            student = "".join(lines[:end + 1]) + closer + "int two(int x, int) { return x; }\n" + "".join(lines[end + 1:])
            with self.assertRaises(make_starter.MergeError, msg=opener) as caught:
                make_starter.variant_text(SOLUTION, "solution/lab/x.cpp", student, "starter/lab/x.cpp", {"lab-1"})
            self.assertIn("open", str(caught.exception))


@unittest.skipUnless(shutil.which("g++") and shutil.which("nm"), "g++ and binutils")
class ObjectChecks(unittest.TestCase):
    """amplab_objects.check: what a compiled file defines, calls and runs before main()."""

    def compiled(self, dir_, name, text):
        path = write(dir_, name + ".cpp", text)
        subprocess.run(["g++", "-c", "-O1", path, "-o", os.path.join(dir_, name + ".o")], check=True)
        return os.path.join(dir_, name + ".o")

    def test_findings(self):
        import amplab_objects
        with tempfile.TemporaryDirectory() as tmp:
            reference = self.compiled(tmp, "ref", "#include <cmath>\nnamespace lab { double f(double x) { return std::sqrt(x); } }\n")
            honest = self.compiled(tmp, "honest", "#include <cmath>\n#include <iostream>\n#include <vector>\n"
                                   "namespace lab { double helper(double x) { std::vector<double> v{x}; "
                                   "std::cout << v[0]; return v[0]; }\n"
                                   "double f(double x) { return std::sqrt(helper(x)); } }\n")
            self.assertEqual(amplab_objects.check(honest, reference), [])
            cases = {
                "write": '#include <unistd.h>\nextern "C" ssize_t write(int, const void*, size_t) { return 0; }\n',
                "fork": "#include <unistd.h>\nint g() { return fork(); }\n",
                "msgget": "#include <sys/msg.h>\nint g() { return msgget(1, 0); }\n",
                "getenv": "#include <cstdlib>\nconst char* g() { return std::getenv(\"X\"); }\n",
                "fstream": '#include <fstream>\nvoid g() { std::ofstream out("/tmp/x"); out << 1; }\n',
                "main()": "int side(); static int early = side();\n",
                ".fini_array": "#include <cstdio>\n__attribute__((destructor)) static void late() { std::puts(\"x\"); }\n",
                "before main()": "#include <cstdio>\n[[gnu::noinline]] static int side() { std::puts(\"x\"); return 1; }\n"
                                 "static int early = side();\n",
                "amplab::test": 'extern "C" int _ZN6amplab4test6judged4roleEv() { return 0; }\n',
                "operator new": "#include <cstdlib>\n#include <new>\n"
                                "void* operator new(std::size_t n) { return std::malloc(n ? n : 1); }\n",
                "at::addThreadLocalCallback": "namespace at { struct RecordFunctionCallback {}; "
                                              "unsigned long addThreadLocalCallback(RecordFunctionCallback); }\n"
                                              "unsigned long g() { return at::addThreadLocalCallback({}); }\n",
                "std::vector<amplab::test": "#include <vector>\nnamespace amplab::test::judged { struct Operand { int v; }; }\n"
                                            "using O = amplab::test::judged::Operand;\n"
                                            "template <> void std::vector<O>::push_back(const O& o) { (void)o; }\n"
                                            "void use(std::vector<O>& v) { v.push_back(O{1}); }\n",
            }
            for name, text in cases.items():
                findings = amplab_objects.check(self.compiled(tmp, "x", text), reference)
                self.assertTrue(any(name in f for f in findings), f"{name}: {findings}")


@unittest.skipUnless(os.geteuid() == 0 and shutil.which("bwrap"), "root and bubblewrap")
class TestIsolation(unittest.TestCase):
    """Two tests at once cannot see each other's /dev/shm or SysV IPC, nor write to /tmp, and nothing of a
    test outlives it."""

    def test_a_test_neither_shares_nor_leaves_anything(self):
        import threading
        import amplab_sandbox
        box = amplab_sandbox.Sandbox([])
        if not box.namespaces:
            self.skipTest("bubblewrap cannot make namespaces here")
        script = "echo x > /dev/shm/amplab-probe && ! (echo x > /tmp/amplab-probe) && ipcmk -Q >/dev/null && sleep 2"
        runs = {}
        first = threading.Thread(target=lambda: runs.update(a=box.run(["sh", "-c", script], {"PATH": "/usr/bin:/bin"},
                                                                      "/", 30, {"sh": "/bin/sh"})))
        first.start()
        time.sleep(1)
        other = amplab_sandbox.Sandbox([], user=amplab_sandbox.USER + "2")
        probe = "ls /dev/shm/amplab-probe /tmp/amplab-probe 2>&1; ipcs -q | grep -c '^0x' || true"
        runs["b"] = other.run(["sh", "-c", probe], {"PATH": "/usr/bin:/bin"}, "/", 30, {"sh": "/bin/sh"})
        self.assertFalse(os.path.exists("/dev/shm/amplab-probe"))  # the machine's own, during the first test
        first.join()
        seen = runs["b"].output()
        self.assertIn("No such file", seen)
        self.assertEqual(seen.strip().splitlines()[-1], "0", seen)
        self.assertEqual(runs["a"].code, 0, runs["a"].output())
        self.assertEqual(subprocess.run(["ipcs", "-q"], capture_output=True, text=True).stdout.count("amplab-student"), 0)


class BuildMessages(unittest.TestCase):
    """A variant that does not compile: nothing of the reference's code is quoted back."""

    def test_lines_about_the_reference_are_replaced(self):
        with tempfile.TemporaryDirectory() as tmp:
            log = write(tmp, "build.log", """\
                $ ninja
                course-reference/x.cpp: In function 'int f()':
                course-reference/x.cpp:40:10: error: 'secret_name' was not declared in this scope
                   40 |   return secret_name + secret_formula;
                      |          ^~~~~~~~~~~
                starter/lab/x.cpp:3:1: error: expected ';'
                    3 |   int x
                      |       ^
                course-reference/x.cu(41): error: identifier "other" is undefined
                      return other * secret_formula;
                             ^
                FAILED: x.o
                """)
            self.assertIn("another TODO does not compile with your file", grade.first_error(log))
            shown = grade.hide_reference(log.read_text())
            self.assertNotIn("secret", shown)
            self.assertIn("starter/lab/x.cpp:3:1: error: expected ';'", shown)
            self.assertIn("    3 |   int x", shown)  # the student's own line is quoted


class GradescopeFormat(unittest.TestCase):
    """results.json against Gradescope's autograder format (what its upload accepts)."""

    def result(self, status, score, points, gpus=0):
        return {"lab": "lab", "todo": "lab-1", "test": "A.b", "status": status, "score": score, "points": points,
                "message": "", "details": "", "description": "", "visibility": "visible", "gpus": gpus, "tags": [],
                "seconds": 0.1}

    def test_what_grade_writes_is_valid(self):
        results = [self.result("passed", 2, 2), self.result("failed", 0, 3), self.result("needs_gpu", 0, 4, gpus=1)]
        written = grade.gradescope(results, 12.5, "summary")
        self.assertEqual(grade.gradescope_problems(written), [])
        self.assertEqual(written["score"], 2)
        self.assertEqual(sum(t["max_score"] for t in written["tests"]), 5, "a test not run counts in no total")
        self.assertNotIn("status", written["tests"][2], "not run: neither passed nor failed")

    def test_problems_are_named(self):
        bad = {"score": "9", "tests": [{"name": "x", "score": 1, "max_score": 1, "status": "ok", "visibility": "public",
                                        "colour": "red"}]}
        problems = grade.gradescope_problems(bad)
        self.assertIn("score is not a number", problems)
        self.assertTrue(any("status 'ok'" in p for p in problems), problems)
        self.assertTrue(any("visibility 'public'" in p for p in problems), problems)
        self.assertTrue(any("unknown key 'colour'" in p for p in problems), problems)
        self.assertIn("score exceeds the sum of max_score",
                      grade.gradescope_problems({"score": 3, "tests": [{"score": 1, "max_score": 1}]}))


class Reports(unittest.TestCase):
    def test_clip_keeps_the_start_and_says_where_it_cut(self):
        text = "first failure\n" + "x" * 100
        clipped = grade.clip(text, 20, "logs/t.log")
        self.assertTrue(clipped.startswith("first failure"))
        self.assertIn("cut here: 94 more characters; the whole output is in logs/t.log", clipped)
        self.assertEqual(grade.clip("short", 20), "short")

    def test_merge_counts_each_test_once_from_the_pass_that_ran_it(self):
        def test(name, result, score, max_score):
            return {"name": name, "score": score, "max_score": max_score, "status": "passed" if score else "failed",
                    "extra_data": {"lab": "lab", "test": name, "result": result}}
        cpu = {"tests": [test("A.cpu", "passed", 2, 2), test("B.gpu_CUDA", "needs_gpu", 0, 0)]}
        gpu = {"tests": [test("A.cpu", "passed", 2, 2), test("B.gpu_CUDA", "failed", 0, 3)]}
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            (tmp / "cpu.json").write_text(json.dumps(cpu))
            (tmp / "gpu.json").write_text(json.dumps(gpu))
            grade.merge_results([tmp / "cpu.json", tmp / "gpu.json"], tmp / "out")
            merged = json.loads((tmp / "out" / "results.json").read_text())
        self.assertEqual([t["name"] for t in merged["tests"]], ["A.cpu", "B.gpu_CUDA"])
        self.assertEqual(merged["score"], 2)
        self.assertEqual(sum(t["max_score"] for t in merged["tests"]), 5)


if __name__ == "__main__":
    unittest.main()
