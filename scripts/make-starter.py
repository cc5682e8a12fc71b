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
Device code (a CUDA kernel's body, in a .cu file) cannot throw: its fence opens with
`// BEGIN SOLUTION DEVICE` and becomes AMPLAB_TODO_DEVICE("<id>"); (a no-op), and the kernel's
host-side launcher has a hole of the same TODO that throws.

    scripts/make-starter.py            # regenerate every lab's starter
    scripts/make-starter.py --check    # exit 1 if starter/ differs from what solution/ generates (CI)

Grading variants (variant_text, used by scripts/grade) are how a lab is graded one TODO at a
time: for the TODOs a test grades, the student's file with their code in those holes and the
reference's code in every other hole, chosen when the file is written, so the graded TODO's
reference is in neither the file nor the program built from it. The student's code of a hole is
everything between the given code lines around its AMPLAB_TODO line (student_regions), so code
written beside a marker line that was left in place is theirs too. A file where that cannot be
told (the given code around a hole changed, two holes with no given code between them) raises
MergeError; scripts/grade then grades the file as a whole and says so to the student.

The same variants certify the rubric (scripts/grade --certify): the untouched starter graded
with each TODO emptied alone must fail every test graded with that TODO.
"""
import argparse
import difflib
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import amplab_screen as screen  # noqa: E402  (lexical_state: where a hole's reference goes)

ROOT = pathlib.Path(__file__).resolve().parent.parent
TODO = re.compile(r"^\s*// TODO\(([a-z0-9_]+-\d+)\):")
BEGIN = re.compile(r"^(\s*)// BEGIN SOLUTION\s*$")
BEGIN_DEVICE = re.compile(r"^(\s*)// BEGIN SOLUTION DEVICE\s*$")
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
            elif BEGIN.match(line) or BEGIN_DEVICE.match(line):
                raise FenceError(f"{name}:{number}: BEGIN SOLUTION inside another fence")
            continue
        todo = TODO.match(line)
        if todo:
            if todo_id is not None:
                raise FenceError(f"{name}:{number}: TODO({todo_id}) above has no BEGIN SOLUTION fence before this TODO")
            todo_id = todo.group(1)
        begin = BEGIN.match(line) or BEGIN_DEVICE.match(line)
        if begin:
            if todo_id is None:
                raise FenceError(f"{name}:{number}: BEGIN SOLUTION without a '// TODO(<lab>-<n>):' line before it")
            macro = "AMPLAB_TODO_DEVICE" if BEGIN_DEVICE.match(line) else "AMPLAB_TODO"
            out.append(f'{begin.group(1)}{macro}("{todo_id}");\n')
            inside, todo_id = True, None
            continue
        if END.match(line):
            raise FenceError(f"{name}:{number}: END SOLUTION without BEGIN SOLUTION")
        out.append(line)  # a TODO comment applies to the next fence (above a function: the one in its body)
    if inside:
        raise FenceError(f"{name}: BEGIN SOLUTION is never closed")
    if todo_id is not None:
        raise FenceError(f"{name}: TODO({todo_id}) has no BEGIN SOLUTION fence below it")
    if not any(HOLE.match(line) for line in out):
        lab = pathlib.Path(name).parent.name
        raise FenceError(f"{name}: no TODO here: code the lab gives (no hole in it) lives in labs/{lab}/given/, "
                         "its one home, compiled into every variant of the lab")
    return HEADER + "".join(out)


HOLE = re.compile(r'^(\s*)AMPLAB_TODO(_DEVICE)?\("([a-z0-9_]+-\d+)"\);\s*$')


class MergeError(Exception):
    pass


def solution_fences(source: str, name: str):
    """The fences of a solution file, in order: (todo id, device?, first line number, body lines)."""
    fences, todo_id, body, start, device = [], None, None, 0, False
    for number, line in enumerate(source.splitlines(keepends=True), start=1):
        if body is not None:
            if END.match(line):
                fences.append((todo_id, device, start, body))
                body, todo_id = None, None
            else:
                body.append(line)
            continue
        todo = TODO.match(line)
        if todo:
            todo_id = todo.group(1)
        if BEGIN.match(line) or BEGIN_DEVICE.match(line):
            if todo_id is None:
                raise FenceError(f"{name}:{number}: BEGIN SOLUTION without a '// TODO(<lab>-<n>):' line before it")
            body, start, device = [], number + 1, bool(BEGIN_DEVICE.match(line))
    return fences


def is_comment_or_blank(line: str) -> bool:
    text = line.strip()
    return not text or text.startswith("//")


def student_regions(starter: list, mine: list, holes: list, fence_of: dict, student_name: str) -> dict:
    """{starter line of a hole: (first, end) lines of the student's file that are their code for it}.

    A hole's code is everything between the given code lines around it (the nearest line above
    and below the AMPLAB_TODO line that is neither blank nor a comment), wherever those lines
    are in the student's file: code written above a marker line that was left in place is theirs,
    and so is the marker line itself. Raises MergeError when the given code around a hole was
    changed (it cannot be told where their code starts), or when two holes share the same given
    lines (nothing tells their code apart)."""
    mapping = {}
    for tag, a1, a2, b1, b2 in difflib.SequenceMatcher(None, starter, mine, autojunk=False).get_opcodes():
        if tag == "equal":
            for offset in range(a2 - a1):
                mapping[a1 + offset] = b1 + offset
    hole_set = set(holes)
    regions = {}
    for hole in holes:
        before = hole - 1
        while before >= 0 and is_comment_or_blank(starter[before]):
            before -= 1
        after = hole + 1
        while after < len(starter) and is_comment_or_blank(starter[after]):
            after += 1
        todo_id = fence_of[hole][0]
        for anchor in (before, after):
            if anchor in hole_set:
                raise MergeError(f"{student_name}: the holes of {todo_id} and {fence_of[anchor][0]} have no "
                                 "given code between them")
            if 0 <= anchor < len(starter) and anchor not in mapping:
                raise MergeError(f"{student_name}: the given line around {todo_id} was changed "
                                 f"(\"{starter[anchor].strip()[:60]}\")")
        first = mapping[before] + 1 if before >= 0 else 0
        end = mapping[after] if after < len(starter) else len(mine)
        if end < first:
            raise MergeError(f"{student_name}: the given code around {todo_id} is out of order")
        regions[hole] = (first, end, before, after)
    spans = sorted(regions.values())
    for (f1, e1, _, _), (f2, _, _, _) in zip(spans, spans[1:]):
        if f2 < e1:
            raise MergeError(f"{student_name}: the code of two holes overlaps")
    return regions


VARIANT_HEADER = ("// Generated by scripts/grade (make-starter.py's variant_text) for grading: the student's code\n"
                  "// in the holes of {todos}, the course's reference in every other hole.\n")


def variant_text(solution: str, solution_name: str, student: str, student_name: str, selected) -> str:
    """The file a graded test is built from: the student's code in the holes of the TODOs in
    `selected` (their file around it, helpers included), the reference's code in every other hole,
    chosen here, when the file is made, not at run time. The reference of a selected TODO is not
    in the text at all. Raises MergeError when the student's code of a hole cannot be told apart
    (the caller grades the file as a whole)."""
    fences = solution_fences(solution, solution_name)
    starter = starter_text(solution, solution_name).splitlines(keepends=True)
    mine = student.splitlines(keepends=True)
    holes = [i for i, line in enumerate(starter) if HOLE.match(line)]
    if len(holes) != len(fences):
        raise MergeError(f"{solution_name}: {len(fences)} fences but {len(holes)} holes in its starter")
    fence_of = {hole: fences[k] for k, hole in enumerate(holes)}
    regions = student_regions(starter, mine, holes, fence_of, student_name)
    for hole, (first, _, before, _) in regions.items():  # the reference goes where the course's code would
        if fence_of[hole][0] in selected:
            continue
        theirs, ours = screen.lexical_state("".join(mine[:first])), screen.lexical_state("".join(starter[:before + 1]))
        if theirs != ours:
            raise MergeError(f"{student_name}: the code before {fence_of[hole][0]}'s hole leaves "
                             f"{screen.describe_state(theirs)} where the course's code has "
                             f"{screen.describe_state(ours)}")
    lab_file = "course-reference/" + pathlib.Path(solution_name).name  # no instructor path in messages
    out = [VARIANT_HEADER.format(todos=", ".join(sorted(selected)) or "no TODO"), f'#line 1 "{student_name}"\n']
    position = 0
    for hole in sorted(regions, key=lambda h: regions[h][0]):
        first, end, before, after = regions[hole]
        todo_id, _, fence_start, body = fence_of[hole]
        out.extend(mine[position:first])
        if todo_id in selected:
            out.extend(mine[first:end])
        else:
            for i in range(before + 1, after):
                if i == hole:
                    out.append(f'#line {fence_start} "{lab_file}"\n')
                    out.extend(body)
                else:
                    out.append(starter[i])
        out.append(f'#line {end + 1} "{student_name}"\n')
        position = end
    out.extend(mine[position:])
    return "".join(out)


def holes_of_file(solution: str, solution_name: str) -> list:
    """The TODO ids whose holes are in a solution file."""
    return [fence[0] for fence in solution_fences(solution, solution_name)]


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
