#!/usr/bin/env python3
"""Generates starter/<lab>/ from solution/<lab>/, the only hand-edited copy of lab code.

In solution/, every hole is fenced:

    // TODO(mnist-2): what to do, with hints
    // (more hint lines)
    // BEGIN SOLUTION
    ...the reference code...
    // END SOLUTION

and the starter gets the TODO lines followed by AMPLAB_TODO("mnist-2"); which throws
amplab::NotImplemented naming the hole. Everything outside the fences is copied as it is.

    scripts/make-starter.py            # regenerate every lab's starter
    scripts/make-starter.py --check    # exit 1 if starter/ differs from what solution/ generates (CI)
"""
import argparse
import difflib
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
TODO = re.compile(r"^\s*// TODO\(([a-z0-9_]+-\d+)\):")
BEGIN = re.compile(r"^(\s*)// BEGIN SOLUTION\s*$")
END = re.compile(r"^\s*// END SOLUTION\s*$")
HEADER = ("// Your copy of this lab's code: fill in every TODO(...) below; the tests tell you which one\n"
          "// fails. (Instructors: generated from solution/ by scripts/make-starter.py; edit the solution.)\n")


class FenceError(Exception):
    pass


def starter_text(source: str, name: str) -> str:
    out, todo_id, inside = [], None, False
    for number, line in enumerate(source.splitlines(keepends=True), start=1):
        if inside:
            if END.match(line):
                inside = False
            elif BEGIN.match(line):
                raise FenceError(f"{name}:{number}: BEGIN SOLUTION inside another fence")
            continue
        todo = TODO.match(line)
        if todo:
            todo_id = todo.group(1)
        begin = BEGIN.match(line)
        if begin:
            if todo_id is None:
                raise FenceError(f"{name}:{number}: BEGIN SOLUTION without a '// TODO(<lab>-<n>):' line before it")
            out.append(f'{begin.group(1)}AMPLAB_TODO("{todo_id}");\n')
            inside, todo_id = True, None
            continue
        if END.match(line):
            raise FenceError(f"{name}:{number}: END SOLUTION without BEGIN SOLUTION")
        if not line.strip().startswith("//"):
            todo_id = None  # a TODO comment only applies to the fence right below it
        out.append(line)
    if inside:
        raise FenceError(f"{name}: BEGIN SOLUTION is never closed")
    return HEADER + "".join(out)


def expected_files():
    for source in sorted((ROOT / "solution").glob("*/*")):
        if source.is_file():
            target = ROOT / "starter" / source.parent.name / source.name
            yield source, target, starter_text(source.read_text(), str(source.relative_to(ROOT)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when starter/ is stale")
    args = parser.parse_args()
    if not (ROOT / "solution").is_dir():
        print("make-starter: no solution/ directory here (a student hand-out): nothing to do")
        return 0
    try:
        files = list(expected_files())
    except FenceError as error:
        print(f"make-starter: {error}", file=sys.stderr)
        return 2
    stale = 0
    for source, target, text in files:
        current = target.read_text() if target.exists() else None
        if current == text:
            continue
        if args.check:
            stale += 1
            rel = target.relative_to(ROOT)
            diff = difflib.unified_diff((current or "").splitlines(), text.splitlines(), f"{rel} (committed)",
                                        f"{rel} (from solution)", lineterm="", n=1)
            print("\n".join(list(diff)[:40]))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            print(f"wrote {target.relative_to(ROOT)}")
    if args.check and stale:
        print(f"make-starter: {stale} starter file(s) are stale; run scripts/make-starter.py and commit", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
