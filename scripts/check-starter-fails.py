#!/usr/bin/env python3
"""Proves that a lab's graded tests can fail: runs the test binary built against the untouched
starter and requires every test that ran to fail (a test skipped for lack of a GPU is reported,
not counted), in each of --repeat runs (default 1; ctest runs 3, so a test that passes on the
starter only now and then is caught). Used by ctest as <lab>.starter_fails_every_graded_test.

    scripts/check-starter-fails.py [--repeat 3] build/bin/mnist_test_starter
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def run_once(binary):
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        proc = subprocess.run([binary, f"--gtest_output=json:{report}"], capture_output=True, text=True, timeout=1200)
        if not os.path.exists(report):
            print(f"{binary} wrote no report (exit {proc.returncode}); its output ends with:\n"
                  f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
            return None
        with open(report) as f:
            data = json.load(f)
    passed, failed, skipped = [], [], []
    for suite in data.get("testsuites", []):
        for test in suite.get("testsuite", []):
            name = f"{suite['name']}.{test['name']}"
            if test.get("result") == "SKIPPED" or test.get("status") == "NOTRUN":
                skipped.append(name)
            elif test.get("failures"):
                failed.append(name)
            else:
                passed.append(name)
    return passed, failed, skipped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=1, help="runs of the whole binary (default 1)")
    parser.add_argument("binary")
    args = parser.parse_args()
    ok = True
    for run in range(1, args.repeat + 1):
        result = run_once(args.binary)
        if result is None:
            return 1
        passed, failed, skipped = result
        if run == 1:
            for name in skipped:
                print(f"skipped (needs a GPU here): {name}")
        for name in passed:
            print(f"run {run}: PASSES on the untouched starter (a graded test must fail there): {name}")
        print(f"run {run}/{args.repeat}: {args.binary}: {len(failed)} failed as they should, {len(passed)} passed, "
              f"{len(skipped)} skipped")
        if passed or not failed:
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
