#!/usr/bin/env python3
"""Checks that a lab's rubric says the truth about which tests grade which TODO, and that the
solution passes its graded tests reliably:

1. the solution's test binary passes every graded test --repeat times in a row (no flakes);
2. each graded test is graded as scripts/grade grades it: with the student's code for its own
   TODO and its also_needs, the reference for every other TODO. The "holes" test binary is the
   untouched starter merged with the reference (scripts/make-starter.py --holes), so running a
   test with AMPLAB_STUDENT_TODOS=<id> is grading it for a student who left exactly TODO <id>
   empty. For every test and every TODO the rubric names for it, the test must fail then: the
   points are on a TODO the test really exercises. (A test never depends on the other TODOs:
   the reference fills them.)

A test skipped here (no GPU) is left out of the comparison and listed. Used by ctest as
<lab>.rubric_holes (label slow): one build, the lab's suite run once per TODO.

    scripts/check-rubric-holes.py --lab mnist --solution build/bin/mnist_test_solution \\
        --holes build/bin/mnist_test_holes [--repeat 3] [--extra-tests DIR]
"""
import argparse
import os
import pathlib
import re
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import amplab_rubric as rubric  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lab", required=True)
    parser.add_argument("--solution", required=True, help="the lab's test binary built from solution/")
    parser.add_argument("--holes", required=True, help="the lab's test binary built from the holes variant")
    parser.add_argument("--repeat", type=int, default=3, help="runs of the solution's suite (default 3)")
    parser.add_argument("--extra-tests", help="a directory of extra tests with their rubric files (*.yaml)")
    parser.add_argument("--root", default=str(rubric.ROOT))
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per run of a whole suite")
    args = parser.parse_args()
    rubric.ensure_yaml()
    root = pathlib.Path(args.root)
    started = time.monotonic()
    try:
        tests = rubric.load_lab_rubric(root, args.lab, args.extra_tests)
        todos = rubric.todo_ids(root / "solution" / args.lab)
        listed = rubric.list_tests(args.holes)
    except rubric.RubricError as error:
        print(f"check-rubric-holes: {error}")
        return 1
    found = rubric.problems(args.lab, tests, todos, listed)
    if found:
        print("\n".join(f"check-rubric-holes: {args.lab}: {p}" for p in found))
        print("fix the rubric first (scripts/check-rubric.py says the same)")
        return 1
    env = dict(os.environ)
    env.pop("AMPLAB_STUDENT_TODOS", None)
    ok = True

    # 1. The solution, several times in a row.
    code, seconds, output, parsed = rubric.run_gtest(args.solution, [f"--gtest_repeat={args.repeat}"], env, root,
                                                     args.timeout * args.repeat)
    failing = sorted(set(re.findall(r"^\[  FAILED  \] (\S+) \(", output, re.M)))
    if code is None or parsed is None or code != 0 or failing:
        ok = False
        why = "timed out" if code is None else rubric.describe_exit(code) if parsed is None else f"exit {code}"
        print(f"solution: FAILS ({why}) in {args.repeat} runs: {', '.join(failing) or 'see the output'}")
        print(rubric.tail(output, 4000))
    skipped = sorted(n for n, r in (parsed or {}).items() if r[0] == "skipped")
    if ok:
        print(f"solution: {len(listed) - len(skipped)} graded tests passed {args.repeat} runs in a row ({seconds:.0f} s)")
    for name in skipped:
        print(f"  skipped here, not checked: {name} ({parsed[name][1]})")

    # 2. Each TODO emptied alone, for the tests the rubric grades with it.
    checked = [n for n in listed if n not in skipped]
    print(f"{'TODO':<16} {'tests that fail':>16}  {'time':>6}  problems")
    for todo in todos:
        expected = sorted(t.test for t in tests if todo in t.todos and t.test in checked)
        if not expected:
            print(f"{todo:<16} {'0/0':>16}  {0:5.0f}s  (no test runs here: GPU-only?)")
            continue
        env["AMPLAB_STUDENT_TODOS"] = todo
        code, seconds, output, parsed = rubric.run_gtest(args.holes, ["--gtest_filter=" + ":".join(expected)], env,
                                                         root, args.timeout)
        if parsed is None:
            ok = False
            print(f"{todo:<16} {'-':>16}  {seconds:5.0f}s  the run {'timed out' if code is None else rubric.describe_exit(code)}")
            print(rubric.tail(output, 3000))
            continue
        passing = [n for n in expected if parsed.get(n, ("failed",))[0] != "failed"]
        notes = [f"{name} passes with {todo} empty: the rubric grades it with {todo}; remove {todo} from it "
                 "or make the test exercise it" for name in passing]
        ok = ok and not notes
        print(f"{todo:<16} {len(expected) - len(passing):>7}/{len(expected):<8}  {seconds:5.0f}s  {'ok' if not notes else ''}")
        for note in notes:
            print(f"    {note}")
    print(f"{args.lab}: {'every test fails without the TODOs it is graded with' if ok else 'PROBLEMS above'} ({time.monotonic() - started:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
