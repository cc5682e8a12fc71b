#!/usr/bin/env python3
"""Fails when a README or hand-out names a file or folder of the repository that does not exist.

Every `backticked` path (and every path in a fenced code block) in README.md, ARCHITECTURE.md,
labs/<lab>/README.md, labs/<lab>/INSTRUCTOR.md, bench/README.md and data/README.md that starts
with one of the repository's own folders (src/, apps/, labs/, solution/, starter/, scripts/,
tests/, bench/, configs/, cmake/, .ci/) must exist in the checkout; a glob
(`src/amplab/fast/cuda/*.cu`) must match something. Placeholders (`labs/<lab>/README.md`),
generated places (runs/, build/, data/) and a path:line suffix are allowed. Run in the
instructor's checkout (a hand-out leaves out files the instructor's documents name).

    scripts/check-readme-paths.py [--root DIR]      (ctest readme_paths_exist)
"""
import argparse
import glob
import pathlib
import re
import sys

FOLDERS = ("src/", "apps/", "labs/", "solution/", "starter/", "scripts/", "tests/", "bench/", "configs/", "cmake/",
           ".ci/")
SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)


def candidates(text):
    for span in SPAN.findall(FENCE.sub("", text)) + FENCE.findall(text):
        for word in span.split():
            word = word.strip("'\"(),;:")
            if word.startswith("./"):
                word = word[2:]
            if word.startswith(FOLDERS) and "<" not in word and "{" not in word and "$" not in word:
                yield re.sub(r":\d+(-\d+)?$", "", word)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parents[1]))
    root = pathlib.Path(parser.parse_args().root)
    documents = [root / "README.md", root / "ARCHITECTURE.md"] + sorted(root.glob("labs/*/README.md")) + \
        sorted(root.glob("labs/*/INSTRUCTOR.md")) + sorted(root.glob("bench/README.md")) + \
        sorted(root.glob("data/README.md"))
    missing = []
    for doc in documents:
        if not doc.exists():
            continue
        for name in sorted(set(candidates(doc.read_text()))):
            path = name.rstrip("/")
            found = glob.glob(str(root / path)) if any(c in path for c in "*?[") else (root / path).exists()
            if not found:
                missing.append(f"{doc.relative_to(root)}: names `{name}`, which this repository does not have")
    for line in missing:
        print(line)
    print(f"check-readme-paths: {len(documents)} documents, {len(missing)} missing paths")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
