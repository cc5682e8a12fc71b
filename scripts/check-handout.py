#!/usr/bin/env python3
"""Proves that a student hand-out carries no answers.

Builds the hand-out (scripts/make-handout, into a temporary directory) and fails when
  1. a run of RUN (3) consecutive non-trivial lines of any solution fence (the code between
     BEGIN SOLUTION and END SOLUTION in solution/) appears anywhere in the hand-out outside
     starter/, in that order, with only blank lines, comments or lone braces between them. A
     single generic line (a catch clause, `return result;`) is not a run; lines of under 12
     characters (after trimming) never count;
  2. the hand-out's core (src/) defines a mechanism that a lab teaches (MECHANISMS below: the
     GradScaler and the training step, activation checkpointing, the memory estimate, the batch
     finder, gradient accumulation, DDP's gradient synchronization), or includes a lab's header
     (labs/<lab>/*.hpp): the core reaches the labs through contracts only.

    scripts/check-handout.py             # builds the hand-out from this checkout, checks it
    scripts/check-handout.py --dir DIR   # checks a hand-out that already exists
Exit 0 when clean; 1 with one line per finding (file:line, what, from where) otherwise.
"""
import argparse
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
RUN = 3
MIN_CHARS = 12
BEGIN = re.compile(r"^\s*// BEGIN SOLUTION")
END = re.compile(r"^\s*// END SOLUTION")
TEXT_SUFFIXES = {".cpp", ".hpp", ".h", ".cu", ".cuh", ".py", ".md", ".yaml", ".yml", ".sh", ".txt", ".cmake", ".json"}

# What only a lab's solution may define: (mechanism, regex over the core's sources). Functions
# are matched where they are defined (at namespace scope, column 0, a line not ending in ';'),
# not where the core declares them as its contract (src/amplab/train/step.hpp) or calls them.
MECHANISMS = [
    ("the GradScaler (lab 2)", re.compile(r"\bclass\s+GradScaler\b|_amp_update_scale_|_amp_foreach_non_finite_check_and_unscale_")),
    ("the training step (lab 2)", re.compile(r"\.scale\([^)]*\)\s*\.backward\(")),
    ("activation checkpointing (lab 3)", re.compile(r"^\w(?!.*;\s*$).*\bcheckpoint_sequential\s*\(|\bCheckpointFunction\b")),
    ("the memory estimate (lab 3)", re.compile(r"^\w(?!.*;\s*$).*\bestimate_memory\s*\(")),
    ("the batch-size finder (lab 3)", re.compile(r"^\w(?!.*;\s*$).*\bfind_batch_size\s*\(")),
    ("gradient accumulation (lab 3)", re.compile(r"^\w(?!.*;\s*$).*\baccumulate_gradients\s*\(")),
    ("DDP's gradient synchronization (lab 5)",
     re.compile(r"\bclass\s+(DistributedDataParallel|\w+Ddp)\b|\ball_reduce\w*\(.*\bgrad|\bgradient_as_bucket_view\b")),
]
# The core never includes a lab: `#include "<a header of labs/<lab>/>"` (the labs' include path is
# labs/<lab>, so it is named bare) or a path into labs/, solution/ or starter/ in src/ is a finding.
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')


def normalized(line: str) -> str:
    """The line as compared: whitespace collapsed; "" for lines that do not count."""
    text = " ".join(line.split())
    if not text or text.startswith(("//", "#", "*", "/*")) or text in {"{", "}", "};", "});", ")", ");"}:
        return ""
    return text if len(text) >= MIN_CHARS else ""


def fence_runs():
    """Every RUN consecutive counted lines of every solution fence: {tuple: 'solution/x.cpp:12'}."""
    runs = {}
    for path in sorted((ROOT / "solution").rglob("*")):
        if not path.is_file() or path.suffix not in {".cpp", ".cu", ".hpp"}:
            continue
        inside, lines = False, []
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
            if BEGIN.match(line):
                inside, lines = True, []
                continue
            if END.match(line):
                inside = False
                for i in range(len(lines) - RUN + 1):
                    runs.setdefault(tuple(text for text, _ in lines[i:i + RUN]),
                                    f"{path.relative_to(ROOT)}:{lines[i][1]}")
                continue
            if inside and normalized(line):
                lines.append((normalized(line), number))
    return runs


def check(handout: pathlib.Path) -> list:
    findings = []
    runs = fence_runs()
    lab_headers = {p.name for p in (handout / "labs").glob("*/*.hpp")}
    for path in sorted(handout.rglob("*")):
        rel = path.relative_to(handout)
        if not path.is_file() or rel.parts[0] in {"starter", ".git"} or path.suffix not in TEXT_SUFFIXES:
            continue
        counted = [(normalized(line), number)
                   for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1)
                   if normalized(line)]
        for i in range(len(counted) - RUN + 1):
            key = tuple(text for text, _ in counted[i:i + RUN])
            if key in runs:
                findings.append(f"{rel}:{counted[i][1]}: {RUN} lines of the solution fence at {runs[key]} "
                                f"(\"{key[0][:60]}\" ...)")
        if rel.parts[0] == "src" and path.suffix in {".cpp", ".hpp", ".cu"}:
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
                include = INCLUDE.match(line)
                if include and (include.group(1) in lab_headers or
                                include.group(1).split("/")[0] in {"labs", "solution", "starter"}):
                    findings.append(f"{rel}:{number}: the core includes a lab's header: \"{line.strip()[:70]}\"")
                if normalized(line) and not line.lstrip().startswith("//"):
                    for what, pattern in MECHANISMS:
                        if pattern.search(line):
                            findings.append(f"{rel}:{number}: the core defines {what}: \"{line.strip()[:70]}\"")
    return findings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", help="an existing hand-out to check (default: make one from this checkout)")
    args = parser.parse_args()
    if not (ROOT / "solution").is_dir():
        print("check-handout: no solution/ here (this is a hand-out): nothing to compare with")
        return 0
    with tempfile.TemporaryDirectory(prefix="amplab-handout-") as tmp:
        handout = pathlib.Path(args.dir) if args.dir else pathlib.Path(tmp) / "handout"
        if not args.dir:
            made = subprocess.run([sys.executable, str(ROOT / "scripts" / "make-handout"), "--no-git", str(handout)],
                                  capture_output=True, text=True)
            if made.returncode != 0:
                print(f"check-handout: make-handout failed:\n{made.stdout}{made.stderr}", file=sys.stderr)
                return 1
        findings = check(handout)
    for finding in findings:
        print(finding)
    if findings:
        print(f"check-handout: {len(findings)} answer(s) in the hand-out outside starter/", file=sys.stderr)
        return 1
    print(f"check-handout: no solution code outside starter/, and the core defines none of the "
          f"{len(MECHANISMS)} mechanisms the labs teach")
    return 0


if __name__ == "__main__":
    sys.exit(main())
