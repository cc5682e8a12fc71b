"""scripts/check-handout.py finds answers planted in a hand-out: three lines of a solution fence
outside starter/, a mechanism defined in the core, the core including a lab's header, a TODO hint
that restates its solution's line (while a hint that names a function or says the formula in words
passes); and finds none in the hand-out made from this checkout, which holds no lab's instructor
notes (labs/<lab>/INSTRUCTOR.md), no lab's fault cases (labs/<lab>/faults.py) and no
instructor-only block of a lab's README. ctest: handout_holds_no_answers (label core)."""
import pathlib
import re
import subprocess
import sys
import tempfile
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHECK = ROOT / "scripts" / "check-handout.py"


def fence_lines(path):
    """The non-trivial lines of the first solution fence of a file, as written."""
    inside, lines = False, []
    for line in path.read_text().splitlines():
        if re.match(r"\s*// BEGIN SOLUTION", line):
            inside = True
        elif re.match(r"\s*// END SOLUTION", line):
            if len(lines) >= 3:
                return lines
            inside, lines = False, []
        elif inside and len(line.strip()) >= 12 and not line.strip().startswith("//"):
            lines.append(line)
    return lines


class CheckHandout(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="amplab-check-handout-")
        cls.handout = pathlib.Path(cls.tmp.name) / "handout"
        subprocess.run([sys.executable, str(ROOT / "scripts" / "make-handout"), "--no-git", str(cls.handout)],
                       check=True, capture_output=True)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def check(self):
        return subprocess.run([sys.executable, str(CHECK), "--dir", str(self.handout)], capture_output=True, text=True)

    def planted(self, relative, text):
        """Runs the check with `text` appended to the hand-out's file, then restores the file."""
        path = self.handout / relative
        before = path.read_text()
        path.write_text(before + "\n" + text + "\n")
        try:
            return self.check()
        finally:
            path.write_text(before)

    def planted_hint(self, relative, todo_id, hint, occurrence=0):
        """Runs the check with `hint` as one more comment line right above the hole of `todo_id`
        (its occurrence-th hole in the file), as a hint of that hole, then restores the file."""
        path = self.handout / relative
        before = path.read_text()
        lines = before.splitlines(keepends=True)
        holes = [i for i, line in enumerate(lines) if f'AMPLAB_TODO("{todo_id}")' in line]
        self.assertGreater(len(holes), occurrence, f"{relative}: no hole {occurrence} of {todo_id}")
        hole = holes[occurrence]
        indent = lines[hole][:len(lines[hole]) - len(lines[hole].lstrip())]
        path.write_text("".join(lines[:hole] + [f"{indent}// {hint}\n"] + lines[hole:]))
        try:
            return self.check()
        finally:
            path.write_text(before)

    def test_the_handout_of_this_checkout_is_clean(self):
        result = self.check()
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)

    def test_the_labs_instructor_notes_are_left_out(self):
        notes = sorted(p.relative_to(ROOT) for p in ROOT.glob("labs/*/INSTRUCTOR.md"))
        self.assertTrue(notes, "no labs/*/INSTRUCTOR.md in this checkout: nothing to check")
        for note in notes:
            self.assertFalse((self.handout / note).exists(), f"{note} is in the hand-out")
        for readme in self.handout.glob("labs/*/README.md"):
            self.assertNotIn("instructor-only", readme.read_text(), f"{readme.name}: an instructor-only block")

    def test_the_labs_fault_cases_are_left_out(self):
        cases = sorted(p.relative_to(ROOT) for p in ROOT.glob("labs/*/faults.py"))
        self.assertTrue(cases, "no labs/*/faults.py in this checkout: nothing to check")
        for path in cases:
            self.assertFalse((self.handout / path).exists(), f"{path} is in the hand-out")

    def test_solution_lines_in_the_core_are_found(self):
        lines = fence_lines(ROOT / "solution" / "amp_training" / "grad_scaler.cpp")
        self.assertGreaterEqual(len(lines), 3)
        result = self.planted("src/amplab/measure/timing.cpp", "\n".join(lines[:3]))
        self.assertEqual(result.returncode, 1)
        self.assertIn("src/amplab/measure/timing.cpp", result.stdout)
        self.assertIn("solution/amp_training/grad_scaler.cpp", result.stdout)

    def test_solution_lines_in_a_readme_are_found(self):
        lines = fence_lines(ROOT / "solution" / "memory_optimization" / "checkpointing.cpp")
        result = self.planted("labs/memory_optimization/README.md", "```cpp\n" + "\n".join(lines[:4]) + "\n```")
        self.assertEqual(result.returncode, 1)
        self.assertIn("labs/memory_optimization/README.md", result.stdout)

    def test_a_hint_that_restates_its_solution_is_found(self):
        # The hint matmul_tflops() once had: the expression of its solution's line, in other words.
        result = self.planted_hint("starter/gpu_basics/gpu_basics.cpp", "gpu_basics-6",
                                   "median into TFLOP/s: matmul_flops(n, n, n) / (median ms * 1e9).", occurrence=1)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("starter/gpu_basics/gpu_basics.cpp", result.stdout)
        self.assertIn("the hint of TODO(gpu_basics-6) restates its solution", result.stdout)
        # A line of the fence copied into a hint, from the solution as it is now.
        fence = fence_lines(ROOT / "solution" / "transformer_fp8" / "transformer_fp8.cpp")
        longest = max(fence, key=len).strip()
        result = self.planted_hint("starter/transformer_fp8/transformer_fp8.cpp", "transformer_fp8-1", "e.g. " + longest)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("the hint of TODO(transformer_fp8-1) restates its solution", result.stdout)

    def test_a_hint_that_names_a_function_or_says_the_formula_in_words_passes(self):
        for hint in ("the FLOPs come from your matmul_flops(), the time from time_on_device (amplab::Tf32Guard around it)",
                     "TFLOP/s: the matmul's FLOPs over the median time, minding the units (ms in, 10^12 FLOP/s out)",
                     "use at::cuda::getDeviceProperties for the SMs, the memory and the compute capability"):
            with self.subTest(hint=hint):
                result = self.planted_hint("starter/gpu_basics/gpu_basics.cpp", "gpu_basics-6", hint, occurrence=1)
                self.assertEqual(result.returncode, 0, result.stdout + result.stderr)

    def test_a_mechanism_defined_in_the_core_is_found(self):
        result = self.planted("src/amplab/measure/timing.cpp", "class GradScaler {};")
        self.assertEqual(result.returncode, 1)
        self.assertIn("the GradScaler", result.stdout)
        result = self.planted("src/amplab/measure/timing.cpp", "class BucketedDdp;")
        self.assertIn("DDP's gradient synchronization", result.stdout)

    def test_the_core_including_a_lab_is_found(self):
        result = self.planted("src/amplab/measure/timing.cpp", '#include "ddp_lab.hpp"')
        self.assertEqual(result.returncode, 1)
        self.assertIn("includes a lab's header", result.stdout)


if __name__ == "__main__":
    unittest.main()
