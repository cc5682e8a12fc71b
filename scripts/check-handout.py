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
     (labs/<lab>/*.hpp): the core reaches the labs through contracts only;
  3. a TODO's hint in the hand-out's starter/ restates its solution: a hint line (with the next
     one, for a sentence that wraps) whose code-like tokens contain, in order, at least HINT_RUN
     (3) of the operands (names and numbers) of one line of that hole's fence, and at least
     HINT_SHARE (half) of them. Code-like tokens of prose are what only code looks like: a call
     `f(` and its arguments, names with `_`, `::`, `.` or `->`, camelCase, and words or numbers
     beside an operator (`a * b`, `x = 0`). So `matmul_flops(n, n, n) / (ms * 1e9)` above
     `tflops = matmul_flops(n, n, n) / (summary.median * 1e9);` is one (5 of 7), while a mention of
     the function, `matmul_flops()`, or of the formula in words is not.

    scripts/check-handout.py             # builds the hand-out from this checkout, checks it
    scripts/check-handout.py --dir DIR   # checks a hand-out that already exists
Exit 0 when clean; 1 with one line per finding (file:line, what, from where) otherwise.
"""
import argparse
import importlib.util
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("make_starter", ROOT / "scripts" / "make-starter.py")
make_starter = importlib.util.module_from_spec(_spec)  # solution_fences: each hole's reference code
_spec.loader.exec_module(make_starter)
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


# 3. Hints that restate their solution (the module's docstring says what counts).
HINT_RUN, HINT_SHARE = 3, 0.5
TOKEN = re.compile(r"[A-Za-z_]\w*(?:-[A-Za-z]\w*)*(?:(?:::|->|\.)[A-Za-z_]\w*)*"  # a name, a.b, a::b, a->b, all-gather
                   r"|\d+(?:\.\d+)?(?:[eE]-?\d+)?|::|->|[()\[\]{}<>*/+\-=,;?%&|^]")
OPERATORS = set("*/+-=%<>")
# Words that are never an operand of a hint's code, and the keywords and types that are no operand of a line.
PROSE = set("the a an of to in on or and is it its for as by be with from at one each no not that this when where then "
            "than so if all any into only but are was which what whose their them they there here both two".split())
KEYWORDS = set("return const auto int float double bool void if else for while do static_cast reinterpret_cast "
               "int64_t size_t unsigned long char true false nullptr new delete this template typename constexpr "
               "inline struct class".split())


def is_name(token: str) -> bool:
    return token[:1].isalpha() or token[:1] == "_"


def code_operands(line: str) -> list:
    """The names and numbers of one line of solution code, its trailing comment left out."""
    return [t for t in TOKEN.findall(line.split("//")[0]) if (is_name(t) and t not in KEYWORDS) or t[:1].isdigit()]


def hint_operands(prose: str) -> list:
    """The tokens of a hint's prose that only code looks like (the module's docstring, item 3)."""
    prose = prose.replace("·", "*").replace("×", "*")
    found = [(m.group(), m.start(), m.end()) for m in TOKEN.finditer(prose)]

    def operator_at(j):  # an operator; '-' and '/' only with a space beside them (not all-gather, GB/s)
        if not 0 <= j < len(found) or found[j][0] not in OPERATORS:
            return False
        token, start, end = found[j]
        return token not in "-/" or prose[start - 1:start].isspace() or prose[end:end + 1].isspace()

    out, calls = [], []  # calls: for each open parenthesis, whether it opened a call's arguments
    for i, (token, start, end) in enumerate(found):
        if token == "(":
            calls.append(i > 0 and is_name(found[i - 1][0]) and found[i - 1][2] == start)
        elif token == ")":
            if calls:
                calls.pop()
        elif is_name(token) and token.lower() not in ("e.g", "i.e"):
            looks_like_code = (re.search(r"_|::|->|\.|[a-z][A-Z]|[A-Za-z]\d", token) or prose[end:end + 1] == "(")
            beside = any(calls) or operator_at(i - 1) or operator_at(i + 1)
            if looks_like_code or (beside and token.lower() not in PROSE):
                out.append(token)
        elif token[:1].isdigit() and (any(calls) or operator_at(i - 1) or operator_at(i + 1)):
            out.append(token)
    return out


def same_operand(a: str, b: str) -> bool:
    """`phase_peak` is `tracker.phase_peak`, `amax` is `amax.to`, `scale` is `scale_`; 1 is 1.0."""
    if a[:1].isdigit() or b[:1].isdigit():
        try:
            return float(a) == float(b)
        except ValueError:
            return False
    pa, pb = ([part.rstrip("_") for part in re.split(r"::|->|\.", t)] for t in (a, b))
    n = min(len(pa), len(pb))
    return pa[-n:] == pb[-n:] or pa[:n] == pb[:n]


def in_order(hint: list, code: list) -> int:
    """How many of `code`'s operands appear in `hint`, in the same order (a longest common subsequence)."""
    row = [0] * (len(code) + 1)
    for h in hint:
        previous_diagonal = 0
        for j, c in enumerate(code):
            keep = row[j + 1]
            row[j + 1] = previous_diagonal + 1 if same_operand(h, c) else max(row[j + 1], row[j])
            previous_diagonal = keep
    return row[-1]


def hole_hints(starter: list) -> list:
    """Each hole of a starter file, in order: (its TODO id, [(line number, hint text)]): the comment
    lines from the nearest `// TODO(<its id>):` above the hole down to it."""
    holes = []
    for number, line in enumerate(starter, start=1):
        hole = make_starter.HOLE.match(line)
        if not hole:
            continue
        todo_id = hole.group(3)
        top = number - 1
        while top > 0 and not re.match(rf"\s*// TODO\({re.escape(todo_id)}\):", starter[top - 1]):
            top -= 1
        holes.append((todo_id, [(n, starter[n - 1].strip()[2:].strip()) for n in range(max(top, 1), number)
                                if starter[n - 1].strip().startswith("//")]))
    return holes


def restated_hints(handout: pathlib.Path) -> list:
    """Findings of item 3: hints in the hand-out's starter/ that restate a line of their solution."""
    findings = []
    for starter_file in sorted(handout.glob("starter/*/*")):
        solution_file = ROOT / "solution" / starter_file.parent.name / starter_file.name
        if not solution_file.is_file():
            continue
        fences = make_starter.solution_fences(solution_file.read_text(), str(solution_file.relative_to(ROOT)))
        holes = hole_hints(starter_file.read_text(errors="replace").splitlines())
        for (todo_id, hints), (fence_id, _, _, body) in zip(holes, fences):
            if todo_id != fence_id:
                break  # a starter out of step with its solution: make-handout refuses to make such a hand-out
            code = [(line.strip(), code_operands(line)) for line in body]
            reported = set()
            for k, (number, text) in enumerate(hints):
                window = hint_operands(text + " " + (hints[k + 1][1] if k + 1 < len(hints) else ""))
                for line, operands in code:
                    found = in_order(window, operands) if operands else 0
                    if found >= HINT_RUN and found >= HINT_SHARE * len(operands) and line not in reported:
                        reported.add(line)
                        findings.append(f"{starter_file.relative_to(handout)}:{number}: the hint of TODO({todo_id}) "
                                        f"restates its solution ({found} of the {len(operands)} operands of "
                                        f"\"{line[:60]}\", in order): state the contract, not the code")
    return findings


def check(handout: pathlib.Path) -> list:
    findings = restated_hints(handout)
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
        print(f"check-handout: {len(findings)} answer(s) in the hand-out (solution code outside starter/, or hints that restate their solution)", file=sys.stderr)
        return 1
    print(f"check-handout: no solution code outside starter/, no hint that restates its solution, and the "
          f"core defines none of the {len(MECHANISMS)} mechanisms the labs teach")
    return 0


if __name__ == "__main__":
    sys.exit(main())
