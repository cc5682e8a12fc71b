#!/usr/bin/env python3
"""Checks a lab's rubric (labs/<lab>/rubric.yaml, plus the rubric files of a directory of extra
tests) against the lab's code and its graded test binary: the rubric is valid (known keys, good
values), every TODO in the code (solution/<lab>, or starter/<lab> in a hand-out) has at least one
test, every test maps to a TODO of this lab, no test is listed twice, every rubric test exists in
the binary and every test of the binary is in the rubric. Used by ctest as <lab>.rubric_is_complete.

    scripts/check-rubric.py --lab mnist --binary build/bin/mnist_test_solution [--extra-tests DIR]
    scripts/check-rubric.py --lab mnist          # without a binary: the rubric against the code only
"""
import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import amplab_rubric as rubric  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lab", required=True)
    parser.add_argument("--binary", help="the lab's graded test binary (its --gtest_list_tests)")
    parser.add_argument("--extra-tests", help="a directory of extra tests with their rubric files (*.yaml)")
    parser.add_argument("--root", default=str(rubric.ROOT), help="the checkout (default: this one)")
    args = parser.parse_args()
    rubric.ensure_yaml()
    root = pathlib.Path(args.root)
    try:
        tests = rubric.load_lab_rubric(root, args.lab, args.extra_tests)
        todos = rubric.todo_ids(rubric.lab_code_dir(root, args.lab))
        listed = rubric.list_tests(args.binary) if args.binary else None
    except rubric.RubricError as error:
        print(f"check-rubric: {error}")
        return 1
    found = rubric.problems(args.lab, tests, todos, listed)
    for problem in found:
        print(f"check-rubric: {args.lab}: {problem}")
    total = sum(t.points for t in tests)
    gpu = sum(t.points for t in tests if t.gpus > 0)
    print(f"{args.lab}: {len(tests)} graded tests for {len(todos)} TODOs, {total:g} points ({gpu:g} on a GPU)"
          + (f"; {len(found)} problem(s)" if found else "; rubric complete"))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
