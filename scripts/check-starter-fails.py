#!/usr/bin/env python3
"""Proves that a lab's graded tests can fail: runs the test binary built against the untouched
starter and requires every test that ran to fail (a test skipped for lack of a GPU is reported,
not counted). Used by ctest as <lab>.starter_fails_every_graded_test.

    scripts/check-starter-fails.py build/bin/mnist_test_starter
"""
import json
import os
import subprocess
import sys
import tempfile


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    binary = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        proc = subprocess.run([binary, f"--gtest_output=json:{report}"], capture_output=True, text=True, timeout=1200)
        if not os.path.exists(report):
            print(f"{binary} wrote no report (exit {proc.returncode}); its output ends with:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
            return 1
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
    for name in skipped:
        print(f"skipped (needs a GPU here): {name}")
    for name in passed:
        print(f"PASSES on the untouched starter (a graded test must fail there): {name}")
    print(f"{binary}: {len(failed)} failed as they should, {len(passed)} passed, {len(skipped)} skipped")
    if passed or not failed:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
