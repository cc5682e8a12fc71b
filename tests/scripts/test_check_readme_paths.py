"""scripts/check-readme-paths.py fails on a README that names a file the repository lacks, in a
backticked span or in a code block, and passes placeholders, generated places and globs that
match. ctest: readme_paths_exist (the repository's own documents, then these cases)."""
import pathlib
import subprocess
import sys
import tempfile
import textwrap
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check-readme-paths.py"


def check(readme, files=()):
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        (root / "solution").mkdir()
        for name in files:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text("")
        (root / "README.md").write_text(textwrap.dedent(readme))
        done = subprocess.run([sys.executable, str(SCRIPT), "--root", str(root)], capture_output=True, text=True)
        return done.returncode, done.stdout


class CheckReadmePaths(unittest.TestCase):
    def test_the_repositorys_documents_name_only_files_it_has(self):
        done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
        self.assertEqual(done.returncode, 0, done.stdout)

    def test_a_moved_file_is_named(self):
        code, out = check("Our kernels live in `src/amplab/cuda/*.cu`.\n", ["src/amplab/fast/cuda/add.cu"])
        self.assertEqual(code, 1)
        self.assertIn("`src/amplab/cuda/*.cu`", out)

    def test_a_code_block_is_read_too(self):
        code, out = check("```sh\nscripts/gone.sh --all\n```\n", ["scripts/run.sh"])
        self.assertEqual(code, 1)
        self.assertIn("scripts/gone.sh", out)

    def test_placeholders_globs_and_line_numbers_pass(self):
        code, out = check("See `labs/<lab>/README.md`, `src/amplab/fast/cuda/*.cu`, `apps/mnist/main.cpp:12`, "
                          "`runs/mnist/` and `build/bin/mnist`.\n",
                          ["src/amplab/fast/cuda/add.cu", "apps/mnist/main.cpp"])
        self.assertEqual(code, 0, out)


if __name__ == "__main__":
    unittest.main()
