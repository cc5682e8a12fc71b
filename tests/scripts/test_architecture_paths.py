#!/usr/bin/env python3
"""ARCHITECTURE.md's listing of the step's path (the table between `<!-- step path -->` and
`<!-- /step path -->`) matches the code: each function it names is defined in the file it names,
and each row's file exists. A listing that drifts from the code fails here (ctest:
architecture_listing_matches_the_code). Standard library only."""
import pathlib
import re
import sys
import tempfile
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def rows(markdown: str):
    """[(function, file)] of the step path's table; ValueError when there is no such table."""
    match = re.search(r"<!-- step path -->\n(.*?)<!-- /step path -->", markdown, re.S)
    if not match:
        raise ValueError("ARCHITECTURE.md has no <!-- step path --> table")
    out = []
    for line in match.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`") and cells[1].startswith("`"):
            out.append((cells[0].strip("`"), cells[1].strip("`")))
    return out


def defines(source: str, function: str) -> bool:
    """Whether `source` holds a definition of `function` (`Class::name` or a free `name`): its name
    followed by a parameter list and, after the closing parenthesis, a body's brace (or a
    constructor's initializer list), not a bare call or declaration."""
    name = re.escape(function)
    if "::" not in function:
        name = r"(?<![\w.>:])" + name  # a free function, not a member called through an object
    pattern = re.compile(r"^[^\n;{}]*\b" + name + r"\s*\(([^;{}]|\n)*?\)\s*(const\s*)?(noexcept\s*)?(override\s*)?[{:]",
                         re.M)
    return bool(pattern.search(source))


def problems(root: pathlib.Path):
    found = []
    for function, file in rows((root / "ARCHITECTURE.md").read_text()):
        path = root / file
        if not path.is_file() and file.startswith("solution/"):  # a hand-out: the starter has the same functions
            path = root / "starter" / file[len("solution/"):]
        if not path.is_file():
            found.append(f"{file}: no such file (the row of {function})")
        elif not defines(path.read_text(errors="replace"), function):
            found.append(f"{file}: defines no {function}")
    return found


class StepPath(unittest.TestCase):
    def test_the_listing_matches_the_code(self):
        listed = rows((ROOT / "ARCHITECTURE.md").read_text())
        self.assertGreaterEqual(len(listed), 4)
        self.assertEqual(problems(ROOT), [])

    def test_a_listing_that_drifted_is_caught(self):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            (tmp / "a.cpp").write_text("int Trainer::step(int x) {\n  return x;\n}\nvoid call() { trainer.fit(1); }\n"
                                       "int declared_only(int);\n")
            (tmp / "ARCHITECTURE.md").write_text(
                "<!-- step path -->\n| function | file | what |\n| --- | --- | --- |\n"
                "| `Trainer::step` | `a.cpp` | ok |\n| `fit` | `a.cpp` | only called |\n"
                "| `declared_only` | `a.cpp` | declared |\n| `gone` | `b.cpp` | no file |\n<!-- /step path -->\n")
            self.assertEqual(problems(tmp), ["a.cpp: defines no fit", "a.cpp: defines no declared_only",
                                             "b.cpp: no such file (the row of gone)"])


if __name__ == "__main__":
    sys.exit(unittest.main())
