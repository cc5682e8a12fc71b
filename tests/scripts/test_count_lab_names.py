"""scripts/count-lab-names.py --lists: a list of labs typed outside the registry is found, uses of
one lab's name are not, and the repository has no such list."""
import importlib.util
import pathlib
import subprocess
import sys
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("count_lab_names", ROOT / "scripts" / "count-lab-names.py")
count_lab_names = importlib.util.module_from_spec(spec)
spec.loader.exec_module(count_lab_names)

LABS = ["lab_a", "lab_b", "lab_c", "lab_d"]  # made-up names: this file is no list of the real labs


class ListsOfLabs(unittest.TestCase):
    def test_a_build_list_is_found(self):
        lines = ["# the process tests start these", "add_dependencies(core_process_test lab_c lab_a lab_d amplab-run)"]
        self.assertEqual(count_lab_names.list_in_lines("tests/core/CMakeLists.txt", lines, LABS),
                         (1, ["lab_a", "lab_c", "lab_d"]))

    def test_a_list_over_several_lines_is_found(self):
        lines = ["LABS = [", '    "lab_a",', '    "lab_b",', '    "lab_c",', "]"]
        self.assertEqual(count_lab_names.list_in_lines("scripts/x.py", lines, LABS)[1], ["lab_a", "lab_b", "lab_c"])

    def test_uses_of_one_or_two_names_are_not_lists(self):
        lines = ["scripts/grade STUDENT --lab lab_c", "", "", "", "", "bin/lab_d --set run.device=cpu"]
        self.assertIsNone(count_lab_names.list_in_lines("scripts/grade", lines, LABS))

    def test_a_labs_own_files_may_name_it(self):
        lines = ["starter/lab_c/x and lab_a, lab_d"]
        self.assertIsNone(count_lab_names.list_in_lines("tests/labs/lab_c_test.cpp", lines, LABS))

    def test_the_repository_has_no_list_of_labs_outside_the_registry(self):
        run = subprocess.run([sys.executable, str(ROOT / "scripts" / "count-lab-names.py"), "--lists"],
                             capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)


if __name__ == "__main__":
    unittest.main()
