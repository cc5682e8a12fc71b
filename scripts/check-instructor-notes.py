#!/usr/bin/env python3
"""Fails when a lab's instructor notes (labs/<lab>/INSTRUCTOR.md) leave an instructor without an
answer: every question of the lab README's `## Questions` needs its expected answer, its line in
the written answers' rubric, and the notes must say the hours, the points and what to assign.

The format each INSTRUCTOR.md follows (one pattern for every lab):

    ## Time and points
    **Hours for a strong student:** ...                    (a number of hours)
    **Autograder:** T points in N tests, G of them (K tests) need a GPU   (as labs/<lab>/rubric.yaml says)
    **Written answers:** W points (the rubric below)       (the sum of the rubric's points)
    ## What to assign
    ### On one GPU / ### On an A100 instead of a Hopper / ### On a CPU only
    ## Expected answers
    ### Question 1                                         (one per question of the README, non-empty)
    ## Rubric for the written answers
    | 1 | 3 | ... |                                        (a row per question: its number, its points)
    ## Hint 2 (the exact recipes, for release on request)
    ### TODO <lab>-1                                       (one per TODO of solution/<lab>/, non-empty)
    ## GPU grading pass                                    (says "GPU-minutes per submission")

A question of the README is a line `<n>. ...` at the start of a line of its `## Questions`
section, as src/amplab/report/report.cpp reads them into report.md.

    scripts/check-instructor-notes.py [--root DIR] [--lab LAB]   (ctest instructor_notes_answer_every_question)
Exit 0 when every lab's notes are complete; 1 with one line per gap (file: what is missing).
"""
import argparse
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import amplab_rubric as rubric  # noqa: E402

QUESTION = re.compile(r"^(\d+)\.\s")
ASSIGN = ("### On one GPU", "### On an A100 instead of a Hopper", "### On a CPU only")
NUMBER = r"(\d+(?:\.\d+)?)"


def sections(text: str, level: str = "## ") -> dict:
    """{heading: body} of the headings of one level (`## ` or `### `), in a text."""
    found, heading, body = {}, None, []
    for line in text.splitlines():
        if line.startswith(level):
            if heading is not None:
                found.setdefault(heading, "\n".join(body))
            heading, body = line[len(level):].strip(), []
        elif line.startswith("## ") and level == "### ":  # a higher heading ends the subsections
            if heading is not None:
                found.setdefault(heading, "\n".join(body))
            heading, body = None, []
        elif heading is not None:
            body.append(line)
    if heading is not None:
        found.setdefault(heading, "\n".join(body))
    return found


def section(text: str, prefix: str):
    """The body of the first `## ` section whose heading starts with `prefix` (None when there is none)."""
    for heading, body in sections(text).items():
        if heading.startswith(prefix):
            return body
    return None


def questions(readme: str) -> list:
    """The numbers of the README's questions, in order."""
    body = section(readme, "Questions") or ""
    return [int(m.group(1)) for line in body.splitlines() if (m := QUESTION.match(line))]


def numbered(body: str, word: str) -> dict:
    """{n: its text} of the `### <word> <n>` subsections of a section's body."""
    out = {}
    for heading, text in sections("## x\n" + (body or ""), "### ").items():
        m = re.fullmatch(rf"{word}\s+(\S+)", heading)
        if m:
            out[m.group(1)] = text.strip()
    return out


def todo_ids(root: pathlib.Path, lab: str) -> list:
    ids = []
    for path in sorted((root / "solution" / lab).glob("*")):
        if path.is_file():
            for line in path.read_text(errors="replace").splitlines():
                m = rubric.TODO_MARK.match(line)
                if m and m.group(1) not in ids:
                    ids.append(m.group(1))
    return ids


def check_lab(root: pathlib.Path, lab: str) -> list:
    notes_path, readme_path = root / "labs" / lab / "INSTRUCTOR.md", root / "labs" / lab / "README.md"
    where = str(notes_path.relative_to(root))
    if not notes_path.exists():
        return [f"{where}: missing (the lab's instructor notes)"]
    notes, asked = notes_path.read_text(), questions(readme_path.read_text())
    problems = []
    if not asked:
        problems.append(f"{readme_path.relative_to(root)}: no numbered question under '## Questions'")

    answers = numbered(section(notes, "Expected answers"), "Question")
    for n in asked:
        if not answers.get(str(n)):
            problems.append(f"{where}: no expected answer for question {n} (a '### Question {n}' under "
                            "'## Expected answers', with text)")
    for n in sorted(set(answers) - {str(n) for n in asked}, key=str):
        problems.append(f"{where}: an expected answer for question {n}, which the README does not ask")

    rubric_body = section(notes, "Rubric for the written answers")
    rows = {}
    for line in (rubric_body or "").splitlines():
        m = re.match(rf"^\|\s*(\d+)\s*\|\s*{NUMBER}\s*\|", line)
        if m:
            rows[int(m.group(1))] = float(m.group(2))
    for n in asked:
        if n not in rows:
            problems.append(f"{where}: the written answers' rubric has no row '| {n} | <points> |' for question {n}")

    time = section(notes, "Time and points")
    if time is None:
        problems.append(f"{where}: no '## Time and points' section")
    else:
        if not re.search(rf"\*\*Hours for a strong student:\*\*[^\n]*?{NUMBER}", time):
            problems.append(f"{where}: no '**Hours for a strong student:** <hours>' line")
        written = re.search(rf"\*\*Written answers:\*\*\s*{NUMBER}\s+points", time)
        if not written:
            problems.append(f"{where}: no '**Written answers:** <W> points' line")
        elif rows and abs(float(written.group(1)) - sum(rows.values())) > 1e-9:
            problems.append(f"{where}: the written answers are said to be {written.group(1)} points, but the "
                            f"rubric's rows add up to {sum(rows.values()):g}")
        stated = re.search(rf"\*\*Autograder:\*\*\s*{NUMBER}\s+points\s+in\s+(\d+)\s+tests,\s+{NUMBER}\s+of\s+them\s+"
                           r"\((\d+)\s+tests?\)\s+need\s+a\s+GPU", time)
        tests = rubric.load_rubric(root / "labs" / lab / "rubric.yaml", lab)
        gpu = [t for t in tests if t.gpus > 0]
        actual = (sum(t.points for t in tests), len(tests), sum(t.points for t in gpu), len(gpu))
        wanted = (f"**Autograder:** {actual[0]:g} points in {actual[1]} tests, {actual[2]:g} of them "
                  f"({actual[3]} tests) need a GPU")
        if not stated:
            problems.append(f"{where}: no autograder line; labs/{lab}/rubric.yaml says: '{wanted}'")
        elif (float(stated.group(1)), int(stated.group(2)), float(stated.group(3)), int(stated.group(4))) != actual:
            problems.append(f"{where}: the autograder line is out of date; labs/{lab}/rubric.yaml says: '{wanted}'")

    assign = section(notes, "What to assign") or ""
    for heading in ASSIGN:
        if heading not in assign:
            problems.append(f"{where}: no '{heading}' under '## What to assign'")

    hints = numbered(section(notes, "Hint 2"), "TODO")
    for todo in todo_ids(root, lab):
        if not hints.get(todo):
            problems.append(f"{where}: no hint 2 for {todo} (a '### TODO {todo}' under '## Hint 2', with text)")

    grading = section(notes, "GPU grading pass")
    if grading is None or "GPU-minutes per submission" not in grading:
        problems.append(f"{where}: no '## GPU grading pass' section saying the GPU-minutes per submission")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=str(rubric.ROOT), help="the checkout (default: this one)")
    parser.add_argument("--lab", action="append", help="check only this lab (repeatable)")
    args = parser.parse_args()
    rubric.ensure_yaml()
    root = pathlib.Path(args.root)
    labs = args.lab or sorted(p.parent.name for p in root.glob("labs/*/README.md") if (p.parent / "rubric.yaml").exists())
    problems = [problem for lab in labs for problem in check_lab(root, lab)]
    for problem in problems:
        print(problem)
    asked = sum(len(questions((root / "labs" / lab / "README.md").read_text())) for lab in labs)
    print(f"check-instructor-notes: {len(labs)} labs, {asked} questions, {len(problems)} gap(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
