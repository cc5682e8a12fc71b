#!/usr/bin/env python3
"""The certification record (scripts/amplab_certified.py) in a scratch copy of this checkout: which
recorded runs become stale when one hole, one test, one helper of a test file, one core file, one
mechanism lab and one grader file are edited; and that a corrupted, hand-edited or foreign record is
caught and never trusted. Standard library only (ctest: certification_record_is_sound)."""
import importlib.machinery
import importlib.util
import json
import pathlib
import random
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load_grade(root):
    """The scratch copy's own scripts/grade as a module (its amplab_* modules from its scripts/)."""
    for name in [n for n in sys.modules if n.startswith("amplab_") or n in ("make_starter", "grade")]:
        del sys.modules[name]
    sys.path.insert(0, str(root / "scripts"))
    try:
        loader = importlib.machinery.SourceFileLoader("grade", str(root / "scripts" / "grade"))
        module = importlib.util.module_from_spec(importlib.util.spec_from_loader("grade", loader))
        loader.exec_module(module)
    finally:
        sys.path.remove(str(root / "scripts"))
    return module


def entries(root):
    """{(lab, run key): entry} for every certification run of the checkout at `root`, as
    scripts/grade --certify computes them (its CertificationRecord)."""
    grade = load_grade(root)
    grade.say = lambda message: None
    rubric = grade.rubric
    labs = rubric.graded_labs(root)
    extra = root / "tests" / "hidden" if (root / "tests" / "hidden").is_dir() else None
    plan = {lab: rubric.load_lab_rubric(root, lab, extra) for lab in labs}
    runs = {lab: [(t, todos) for t in plan[lab] for todos in grade.todo_sets(t, True)] for lab in labs}
    files, notes, _ = grade.student_files(root, "starter", labs)
    record = grade.CertificationRecord(labs, runs, files, notes, extra, 0, None, True, 0)
    return {(lab, key): entry for lab in labs for key, entry in record.current[lab].items()}


def stale(before, after):
    """{(lab, key): the parts that moved} for the runs whose digest changed."""
    return {k: [p for p in after[k]["parts"] if after[k]["parts"][p] != before[k]["parts"][p]]
            for k in after if after[k]["digest"] != before[k]["digest"]}


class Scratch:
    """A copy of this checkout's files (git's list), edited by the tests, restored after each."""

    def __init__(self):
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="amplab-certified-"))
        names = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True).stdout
        for name in names.decode().split("\0"):
            if name and (ROOT / name).is_file():
                (self.dir / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, self.dir / name)
        subprocess.run(["git", "init", "-q", str(self.dir)], check=True)
        subprocess.run(["git", "-C", str(self.dir), "add", "-A"], check=True)
        self.saved = {}

    def edit(self, rel, old, new):
        path = self.dir / rel
        text = path.read_text()
        assert old in text, f"{rel}: {old!r} not found"
        self.saved.setdefault(rel, text)
        path.write_text(text.replace(old, new, 1))

    def restore(self):
        for rel, text in self.saved.items():
            (self.dir / rel).write_text(text)
        self.saved = {}


class StaleEntries(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.scratch = Scratch()
        cls.base = entries(cls.scratch.dir)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.scratch.dir, ignore_errors=True)

    def tearDown(self):
        self.scratch.restore()

    def moved(self):
        return stale(self.base, entries(self.scratch.dir))

    def test_nothing_edited_nothing_stale(self):
        self.assertEqual(self.moved(), {})

    def test_one_hole_stales_its_lab_only(self):
        # gpu_basics TODO 1's reference body: the judge links the whole reference, so every run of
        # the lab is certified again; no run of another lab is.
        source = (ROOT / "solution" / "gpu_basics" / "gpu_basics.cpp").read_text()
        begin = source.index("// BEGIN SOLUTION")
        line_end = source.index("\n", begin)
        self.scratch.edit("solution/gpu_basics/gpu_basics.cpp", source[begin:line_end + 1],
                          source[begin:line_end + 1] + "  (void)0;\n")
        moved = self.moved()
        labs = {lab for lab, _ in moved}
        self.assertEqual(labs, {"gpu_basics"})
        self.assertEqual(len(moved), sum(1 for lab, _ in self.base if lab == "gpu_basics"))
        self.assertTrue(all("lab" in parts for parts in moved.values()))

    def test_one_test_stales_its_runs_only(self):
        test = "Mnist1_Placement.ModesRunWhereTheySay"
        text = (ROOT / "tests" / "labs" / "mnist_test.cpp").read_text()
        start = text.index("TEST(Mnist1_Placement, ModesRunWhereTheySay)")
        brace = text.index("{", start)
        self.scratch.edit("tests/labs/mnist_test.cpp", text[start:brace + 1], text[start:brace + 1] + "\n  (void)0;")
        moved = self.moved()
        self.assertTrue(moved)
        self.assertEqual({key.split(" | ")[0] for _, key in moved}, {test})
        self.assertTrue(all(parts == ["test"] for parts in moved.values()))

    def test_a_helper_of_a_test_file_stales_its_lab(self):
        self.scratch.edit("tests/labs/mnist_test.cpp", "namespace {", "namespace {\nint amplab_scratch_helper;", )
        moved = self.moved()
        self.assertEqual({lab for lab, _ in moved}, {"mnist"})
        self.assertEqual(len(moved), sum(1 for lab, _ in self.base if lab == "mnist" and "Hidden" not in _))

    def test_one_core_file_stales_everything(self):
        self.scratch.edit("src/amplab/infra/error.hpp", "#pragma once", "#pragma once\n// edited")
        moved = self.moved()
        self.assertEqual(len(moved), len(self.base))
        self.assertTrue(all(parts == ["core"] for parts in moved.values()))

    def test_one_grader_file_stales_everything(self):
        self.scratch.edit("scripts/amplab_screen.py", '"""', '"""Edited. ', )
        moved = self.moved()
        self.assertEqual(len(moved), len(self.base))
        self.assertTrue(all(parts == ["grader"] for parts in moved.values()))

    def test_a_mechanism_lab_stales_every_lab_that_links_it(self):
        # lab 2's header: every lab that trains through the Trainer links lab 2's code (lab.yaml
        # trains: true); the labs that do not keep their records
        self.scratch.edit("labs/amp_training/grad_scaler.hpp", "#pragma once", "#pragma once\n// edited")
        moved = self.moved()
        sys.path.insert(0, str(ROOT / "scripts"))
        import amplab_labs
        training = {lab.name for lab in amplab_labs.all_labs(ROOT) if lab.trains or lab.mechanisms}
        self.assertLess(len(training), len(amplab_labs.all_labs(ROOT)))  # some lab does not train
        self.assertEqual({lab for lab, _ in moved}, training)
        self.assertEqual(len(moved), sum(1 for lab, _ in self.base if lab in training))
        self.assertTrue(all("lab" in parts for parts in moved.values()))

    def test_a_hint_stales_the_holes_lab(self):
        # a hint is in the starter's text and the variants': the lab's runs are certified again
        self.scratch.edit("solution/amp_training/grad_scaler.cpp", "// TODO(amp_training-1):",
                          "// TODO(amp_training-1): (reworded)")
        self.assertTrue(self.moved())

    def test_instructor_notes_stale_nothing(self):
        self.scratch.edit("labs/mnist/INSTRUCTOR.md", "#", "# edited\n#")
        self.assertEqual(self.moved(), {})


class TheRecord(unittest.TestCase):
    def setUp(self):
        sys.path.insert(0, str(ROOT / "scripts"))
        import amplab_certified
        self.c = amplab_certified
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="amplab-record-"))
        self.runs = {f"T.{i} | lab-{i}": {"digest": f"d{i}", "parts": {"core": "c"}, "status": "failed", "message": ""}
                     for i in range(6)}

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_written_then_read(self):
        self.c.save("lab", self.runs, self.dir)
        runs, _ = self.c.load("lab", self.dir)
        self.assertEqual(runs, self.runs)

    def test_hand_edited_is_discarded(self):
        path = self.c.save("lab", self.runs, self.dir)
        record = json.loads(path.read_text())
        record["runs"]["T.0 | lab-0"]["status"] = "failed" if False else "timeout"
        path.write_text(json.dumps(record))
        runs, why = self.c.load("lab", self.dir)
        self.assertEqual(runs, {})
        self.assertIn("seal", why)

    def test_a_forged_pass_with_its_seal_recomputed_is_still_not_reused(self):
        path = self.c.save("lab", self.runs, self.dir)
        record = json.loads(path.read_text())
        record["runs"]["T.0 | lab-0"]["status"] = "passed"  # a problem: never reused
        record["seal"] = self.c.seal(record)
        path.write_text(json.dumps(record))
        runs, _ = self.c.load("lab", self.dir)
        current = {k: {"digest": v["digest"], "parts": v["parts"]} for k, v in self.runs.items()}
        plan = self.c.plan("lab", current, runs, 0, {k: 0 for k in current}, {k: k for k in current}, 0)
        self.assertIn("T.0 | lab-0", plan.again)

    def test_corrupted_or_foreign_is_discarded(self):
        for text in ("{not json", json.dumps({"format": 1, "lab": "other", "runs": {}}), "[]", ""):
            self.c.record_path("lab", self.dir).write_text(text)
            runs, why = self.c.load("lab", self.dir)
            self.assertEqual(runs, {}, text)
            self.assertIn("discarded", why)

    def test_plan_reuses_what_holds_and_spot_checks_one_variant(self):
        current = {k: {"digest": v["digest"], "parts": v["parts"]} for k, v in self.runs.items()}
        current["T.1 | lab-1"] = {"digest": "moved", "parts": {"core": "c2"}}
        variant = {k: f"v{int(k.split('.')[1][0]) % 3}" for k in current}
        needs = {k: 0 for k in current}
        needs["T.5 | lab-5"] = 1  # a GPU run, not runnable here
        plan = self.c.plan("lab", current, self.runs, 0, needs, variant, 1, random.Random(3))
        self.assertEqual(plan.again, {"T.1 | lab-1": ["core"]})
        self.assertEqual(set(plan.reused), set(current) - {"T.1 | lab-1"})
        chosen = {variant[k] for k in plan.spot_checked}
        self.assertEqual(len(chosen), 1)
        self.assertTrue(all(variant[k] in chosen and needs[k] == 0 for k in plan.spot_checked))
        self.assertNotIn("T.5 | lab-5", plan.spot_checked)

    def test_a_test_block_parser_that_is_unsure_counts_the_whole_file(self):
        self.assertIsNone(self.c.test_sources("TEST(A, B) {\n#define X 1\n}\n"))
        self.assertIsNone(self.c.test_sources("TEST(A, B) { R\"x( } )x\" \n"))
        blocks = self.c.test_sources('int h;\nTEST(A, B) { auto s = "}"; char c = \'}\'; }\nTEST(A, C) { R"(})"; }\n')
        self.assertEqual(set(blocks), {"", "A.B", "A.C"})
        self.assertIn('"}"', blocks["A.B"])
        self.assertEqual(self.c.block_of(blocks, "Prefix/A.C/0"), blocks["A.C"])


if __name__ == "__main__":
    unittest.main()
