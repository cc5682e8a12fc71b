"""scripts/check-config-descriptions.py: a config key described twice is found; one description is not."""
import pathlib
import subprocess
import sys
import tempfile
import unittest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "check-config-descriptions.py"

HEADER = """
struct ToyConfig {
  int64_t batch = 8;%s
  bool verbose = false;

  template <class V>
  void fields(V& v) {
    v.field("batch", batch, "samples per step", Range<int64_t>::at_least(1));
    v.field("verbose", verbose, "say more");
  }
};
"""


def check(text):
    with tempfile.TemporaryDirectory() as root:
        (pathlib.Path(root) / "src").mkdir()
        (pathlib.Path(root) / "src" / "toy.hpp").write_text(text)
        return subprocess.run([sys.executable, str(SCRIPT), "--root", root], capture_output=True, text=True)


class CheckConfigDescriptions(unittest.TestCase):
    def test_a_trailing_comment_beside_the_field_text_is_found(self):
        result = check(HEADER % "  // samples per step")
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn("member 'batch' is described twice", result.stdout)
        self.assertNotIn("'verbose'", result.stdout)

    def test_one_description_passes(self):
        result = check(HEADER % "")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual(result.stdout.strip(), "")


if __name__ == "__main__":
    unittest.main()
