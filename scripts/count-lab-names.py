#!/usr/bin/env python3
"""Where each lab's name is written outside the lab's own folders: a lab should be stated once, in
labs/<lab>/lab.yaml (the registry), so that adding one touches its own folders and, outside them,
at most the top README.

    scripts/count-lab-names.py            # a table: lab, file, lines that name it
    scripts/count-lab-names.py --totals   # one line per lab
    scripts/count-lab-names.py --lists    # lists of labs typed outside the registry; exit 1 if any

Two different things are counted. A *list of labs* (three or more labs named within four lines:
a build list, a script's table of labs) is a lab's identity copied by hand, so that adding a lab
means editing that file: there must be none outside the registry, the top README and
ARCHITECTURE.md (which describes the house as it is). A *use* of a name is counted too but is
not a copy of the identity: a usage example (`--lab mnist`), a core test that starts bin/mnist
as its subject, and the words the labs are named after (the Fashion-MNIST dataset the data room
reads, the DDP class the dist room builds).

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


def list_in_lines(path, lines, labs, window=4):
    """(line number, labs named) of the first place in `lines` (the text of `path`) naming three or
    more labs other than the file's own within `window` lines; None if there is none."""
    patterns = {lab: re.compile(rf"(?<![A-Za-z0-9]){re.escape(lab)}(?![A-Za-z0-9])") for lab in labs}
    for i in range(len(lines)):
        text = "\n".join(lines[i:i + window])
        named = sorted(lab for lab, pattern in patterns.items() if pattern.search(text) and not own(lab, path))
        if len(named) >= 3:
            return i + 1, named
    return None


def lists_of_labs(labs):
    """[(file, line number, labs named)]: the lists of labs outside the places allowed to list them
    (a lab's own folders, the top README, ARCHITECTURE.md)."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    found = []
    for path in files:
        if path in ("README.md", "ARCHITECTURE.md") or path.startswith("labs/"):
            continue
        try:
            lines = (ROOT / path).read_text(errors="strict").splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        hit = list_in_lines(path, lines, labs)
        if hit:
            found.append((path, *hit))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--totals", action="store_true", help="one line per lab")
    parser.add_argument("--lists", action="store_true", help="lists of labs outside the registry; exit 1 if any")
    args = parser.parse_args()
    labs = [lab.name for lab in amplab_labs.labs_or_exit()]
    if args.lists:
        lists = lists_of_labs(labs)
        for path, line, named in lists:
            print(f"{path}:{line}: names {', '.join(named)}: a list of labs; read them from labs/*/lab.yaml "
                  "(scripts/amplab_labs.py, cmake/amplab.cmake) instead")
        if not lists:
            print(f"no list of labs outside labs/*/lab.yaml, README.md and ARCHITECTURE.md ({len(labs)} labs)")
        return 1 if lists else 0
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
