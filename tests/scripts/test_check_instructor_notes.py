"""scripts/check-instructor-notes.py: every lab's INSTRUCTOR.md of this checkout answers every
question of its README (and states hours, points, what to assign, a rubric row per question, hint 2
per TODO and the GPU grading pass); and the check finds each gap planted in a copy of one lab: a
missing answer, an answer the README does not ask for, a question added to the README, a missing
rubric row, written points that do not add up, an autograder line the rubric contradicts, a
missing hint 2, a missing section. ctest: instructor_notes_answer_every_question (label core)."""
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHECK = ROOT / "scripts" / "check-instructor-notes.py"
LAB = "gpu_basics"


class CheckInstructorNotes(unittest.TestCase):
    def run_check(self, root, lab=None):
        command = [sys.executable, str(CHECK), "--root", str(root)] + (["--lab", lab] if lab else [])
        return subprocess.run(command, capture_output=True, text=True)

    def test_every_lab_of_this_checkout_answers_every_question(self):
        result = self.run_check(ROOT)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        counted = re.search(r"(\d+) labs, (\d+) questions, 0 gap", result.stdout)
        self.assertIsNotNone(counted, result.stdout)
        readmes = [p for p in ROOT.glob("labs/*/README.md") if (p.parent / "rubric.yaml").exists()]
        self.assertEqual(int(counted.group(1)), len(readmes))
        self.assertGreater(int(counted.group(2)), len(readmes), "fewer questions than labs: the count is wrong")

    def planted(self, change):
        """The check's output on a copy of one lab where `change(readme, notes)` returns the new
        (readme, notes) texts."""
        with tempfile.TemporaryDirectory(prefix="amplab-instructor-notes-") as tmp:
            root = pathlib.Path(tmp)
            (root / "labs").mkdir()
            shutil.copytree(ROOT / "labs" / LAB, root / "labs" / LAB)
            shutil.copytree(ROOT / "solution" / LAB, root / "solution" / LAB)
            readme, notes = root / "labs" / LAB / "README.md", root / "labs" / LAB / "INSTRUCTOR.md"
            self.assertEqual(self.run_check(root, LAB).returncode, 0, "the unchanged copy must pass")
            new_readme, new_notes = change(readme.read_text(), notes.read_text())
            readme.write_text(new_readme)
            notes.write_text(new_notes)
            result = self.run_check(root, LAB)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        return result.stdout

    def test_a_missing_answer_is_found(self):
        out = self.planted(lambda r, n: (r, re.sub(r"### Question 3\n.*?(?=### Question 4)", "", n, flags=re.S)))
        self.assertIn("no expected answer for question 3", out)

    def test_an_empty_answer_is_found(self):
        out = self.planted(lambda r, n: (r, re.sub(r"(### Question 5\n).*?(?=### Question 6)", r"\1\n", n, flags=re.S)))
        self.assertIn("no expected answer for question 5", out)

    def test_a_question_added_to_the_readme_is_found(self):
        def add(readme, notes):
            return readme.rstrip("\n") + "\n9. **A new question?**\n   <!-- report: matmul.csv -->\n", notes
        out = self.planted(add)
        self.assertIn("no expected answer for question 9", out)
        self.assertIn("no row '| 9 | <points> |' for question 9", out)

    def test_an_answer_to_a_question_not_asked_is_found(self):
        out = self.planted(lambda r, n: (r, n.replace("### Question 8", "### Question 8\nx\n\n### Question 12")))
        self.assertIn("an expected answer for question 12, which the README does not ask", out)

    def test_a_missing_rubric_row_and_points_that_do_not_add_up_are_found(self):
        out = self.planted(lambda r, n: (r, re.sub(r"^\| 4 \| 3 \|.*\n", "", n, flags=re.M)))
        self.assertIn("no row '| 4 | <points> |' for question 4", out)
        self.assertIn("the written answers are said to be 22 points, but the rubric's rows add up to 19", out)

    def test_an_autograder_line_the_rubric_contradicts_is_found(self):
        out = self.planted(lambda r, n: (r, n.replace("**Autograder:** 28 points", "**Autograder:** 30 points")))
        self.assertIn("the autograder line is out of date", out)
        self.assertIn("**Autograder:** 28 points in 13 tests, 8 of them (4 tests) need a GPU", out)

    def test_a_missing_hint_2_and_a_missing_section_are_found(self):
        def remove(readme, notes):
            notes = re.sub(r"### TODO gpu_basics-4\n.*?(?=### TODO gpu_basics-5)", "", notes, flags=re.S)
            return readme, notes.replace("### On a CPU only", "### Elsewhere").replace("**Hours for a strong student:**", "Hours:")
        out = self.planted(remove)
        self.assertIn("no hint 2 for gpu_basics-4", out)
        self.assertIn("no '### On a CPU only' under '## What to assign'", out)
        self.assertIn("no '**Hours for a strong student:** <hours>' line", out)


if __name__ == "__main__":
    unittest.main()
