#!/usr/bin/env python3
"""Where each lab's name is written outside the lab's own folders: a lab should be stated once, in
labs/<lab>/lab.yaml (the registry), so that adding one touches its own folders and, outside them,
at most the top README.

    scripts/count-lab-names.py            # a table: lab, file, lines that name it
    scripts/count-lab-names.py --totals   # one line per lab

A lab's own folders: labs/<lab>/, solution/<lab>/, starter/<lab>/, apps/<lab>/, configs/<lab>*.yaml
and its tests (tests/labs/<lab>_test.cpp, tests/hidden/<lab>_*). The top README is allowed. A
name counts as a whole word (`mnist` in mnist.cpp counts; `ddp` in ddp_reference.py does too).
Tracked files only (git ls-files).
"""
import argparse
import pathlib
import re
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import amplab_labs  # noqa: E402

ROOT = amplab_labs.ROOT


def own(lab, path):
    return (path.startswith((f"labs/{lab}/", f"solution/{lab}/", f"starter/{lab}/", f"apps/{lab}/",
                             f"tests/hidden/{lab}_")) or re.fullmatch(rf"configs/{lab}[^/]*\.yaml", path) is not None
            or path == f"tests/labs/{lab}_test.cpp" or path == "README.md")


def mentions(labs):
    """{lab: {file: number of lines naming it}} outside the lab's own folders."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    found = {lab: {} for lab in labs}
    patterns = {lab: re.compile(rf"(?<![A-Za-z0-9]){re.escape(lab)}(?![A-Za-z0-9])") for lab in labs}
    for path in files:
        try:
            lines = (ROOT / path).read_text(errors="strict").splitlines()
        except (UnicodeDecodeError, OSError):
            continue  # binary files
        for lab, pattern in patterns.items():
            if own(lab, path):
                continue
            count = sum(1 for line in lines if pattern.search(line))
            if count:
                found[lab][path] = count
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--totals", action="store_true", help="one line per lab")
    args = parser.parse_args()
    labs = [lab.name for lab in amplab_labs.labs_or_exit()]
    found = mentions(labs)
    for lab in labs:
        files = found[lab]
        print(f"{lab}: {len(files)} file(s), {sum(files.values())} line(s) outside its own folders")
        if not args.totals:
            for path, count in sorted(files.items()):
                print(f"    {path}: {count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
