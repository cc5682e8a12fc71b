"""Rubrics, shared by scripts/grade and scripts/check-rubric.py.

A rubric (labs/<lab>/rubric.yaml, or any *.yaml in a directory of extra tests) maps each graded
test to the TODO whose points it carries:

    lab: mnist
    defaults:                   # optional: applies to every test that does not say otherwise
      time_limit_s: 60
    tests:
      - test: Mnist1_Placement.ModesRunWhereTheySay   # as `<binary> --gtest_list_tests` names it
        todo: mnist-1           # the TODO these points belong to
        points: 2
      - test: MnistLearns.FashionMnistSubsetAboveSeventyPercent
        todo: mnist-3
        also_needs: [mnist-1, mnist-2]   # an end-to-end test: the student's code for these TODOs too
        points: 6
        time_limit_s: 300
      - test: Mnist1_Placement.ModelAndBatchOnTheGpu_CUDA
        todo: mnist-1
        points: 2
        gpus: 1                 # needs a GPU: reported as "needs GPU", never scored, where there is none
      - test: Kernels7_WarpShuffle.Speed_CUDA
        todo: cuda_kernels-7
        points: 3
        gpus: 1
        speed: {full_within: 1.2}   # a pass scores points x a share of them for the time the grader measures

Keys of a test (and of `defaults`, except test/todo/also_needs): see FIELDS below.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import subprocess
import sys

# Gradescope's visibilities (results.json): shown at once, never, after the due date, after grades are published.
VISIBILITIES = ("visible", "hidden", "after_due_date", "after_published")
# key -> (meaning, type check, default); "required" where there is no default.
FIELDS = {
    "test": "the GoogleTest name, Suite.Test (with the Prefix/ and /suffix of parameterized tests)",
    "todo": "the TODO id whose points these are, <lab>-<n>",
    "also_needs": "other TODO ids whose student code the test runs too (end-to-end tests); without it a test "
                  "runs the student's code for its own TODO only, the reference for the rest",
    "points": "points for passing (a number >= 0)",
    "time_limit_s": "seconds before the test's process is killed (default 60)",
    "memory_mb": "MiB of address space the test's process may use (default 8192; tests that need a GPU get no "
                 "such limit: CUDA maps more than that)",
    "gpus": "GPUs the test needs (default 0); without them it is reported 'needs GPU' and not scored",
    "visibility": "Gradescope visibility: " + ", ".join(VISIBILITIES) + " (default visible)",
    "env": "environment variables for the test's process, e.g. {CUDA_VISIBLE_DEVICES: ''}",
    "tags": "Gradescope tags (the lab and the TODO are always added)",
    "description": "a line for people (shown in the report)",
    "speed": "a speed test, timed by the grader from outside the student's process (the test makes "
             "support.hpp's make_speed_calls_for_the_grader): {full_within: R} scores all the points up to R "
             "times the reference's time and in proportion to the speed beyond (R / ratio); with none_at: N, "
             "in proportion to the time instead, down to none at N times the reference's",
    "partial": "true, for a test judged inside only: a pass scores points x the points_fraction (0..1) the "
               "test records with RecordProperty in the student's own process, the student's word (a "
               "speed test the grader cannot time from outside); none recorded scores 0 (default false)",
    "allow": "what the test's process may do beyond lab code, under the grader's seccomp filter: a list of "
             "'sockets' (a rendezvous on the loopback), 'processes' (it starts the lab binary or ranks) (default [])",
    "judged": "where the verdict is decided: 'outside' (default: the judge, linked with the reference only, "
              "checks the student's observed values against its own run) or 'inside' (the student's process's "
              "own report: for checks on timings or other values two honest runs do not share; the README "
              "counts these points as what an attacker inside the process could still reach)",
}
ALLOWED = ("sockets", "processes")
DEFAULTS = {"time_limit_s": 60, "memory_mb": 8192, "gpus": 0, "visibility": "visible", "env": {}, "tags": [], "description": "",
            "speed": None, "partial": False, "allow": [], "judged": "outside"}
TODO_MARK = re.compile(r"^\s*// TODO\(([a-z0-9_]+-\d+)\):")
ROOT = pathlib.Path(__file__).resolve().parent.parent


class RubricError(Exception):
    pass


def ensure_yaml():
    """PyYAML, from this interpreter or else from the project's .venv (re-running the script there)."""
    try:
        import yaml  # noqa: F401
        return yaml
    except ImportError:
        venv_python = ROOT / ".venv" / "bin" / "python"
        if venv_python.exists() and pathlib.Path(sys.executable).resolve() != venv_python.resolve() \
                and not os.environ.get("AMPLAB_NO_REEXEC"):
            os.environ["AMPLAB_NO_REEXEC"] = "1"
            os.execv(str(venv_python), [str(venv_python)] + sys.argv)
        sys.exit("error: PyYAML is missing: run scripts/setup.sh (it installs pyyaml into .venv), "
                 "or pip install pyyaml")


@dataclasses.dataclass
class RubricTest:
    lab: str
    test: str
    todo: str
    points: float
    also_needs: list = dataclasses.field(default_factory=list)
    time_limit_s: float = 60
    memory_mb: int = 8192
    gpus: int = 0
    visibility: str = "visible"
    env: dict = dataclasses.field(default_factory=dict)
    tags: list = dataclasses.field(default_factory=list)
    description: str = ""
    speed: dict | None = None
    partial: bool = False
    allow: list = dataclasses.field(default_factory=list)
    judged: str = "outside"
    source: str = ""  # the rubric file

    @property
    def todos(self):
        """The TODOs whose student code this test runs (its own first): the variant scripts/grade builds it from."""
        return [self.todo] + [t for t in self.also_needs if t != self.todo]


def _check_value(where, key, value):
    if key in ("test", "todo", "description"):
        if not isinstance(value, str) or (key != "description" and not value):
            raise RubricError(f"{where}: '{key}' must be a non-empty string, not {value!r}")
    elif key == "points":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise RubricError(f"{where}: 'points' must be a number >= 0, not {value!r}")
    elif key == "time_limit_s":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise RubricError(f"{where}: 'time_limit_s' must be a number of seconds > 0, not {value!r}")
    elif key == "memory_mb":
        if isinstance(value, bool) or not isinstance(value, int) or value < 256:
            raise RubricError(f"{where}: 'memory_mb' must be a whole number of MiB >= 256, not {value!r}")
    elif key == "gpus":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise RubricError(f"{where}: 'gpus' must be a whole number >= 0, not {value!r}")
    elif key == "visibility":
        if value not in VISIBILITIES:
            raise RubricError(f"{where}: visibility '{value}' is not one of {', '.join(VISIBILITIES)}")
    elif key in ("also_needs", "tags"):
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise RubricError(f"{where}: '{key}' must be a list of strings, not {value!r}")
    elif key == "partial":
        if not isinstance(value, bool):
            raise RubricError(f"{where}: 'partial' must be true or false, not {value!r}")
    elif key == "speed":
        if value is None:
            return
        numbers = isinstance(value, dict) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                  for v in value.values())
        if not numbers or "full_within" not in value or set(value) - {"full_within", "none_at"} or \
                value["full_within"] < 1 or value.get("none_at", value["full_within"] + 1) <= value["full_within"]:
            raise RubricError(f"{where}: 'speed' must be {{full_within: R}} or {{full_within: R, none_at: N}} with "
                              f"1 <= R < N, not {value!r}")
    elif key == "allow":
        if not isinstance(value, list) or any(v not in ALLOWED for v in value):
            raise RubricError(f"{where}: 'allow' must be a list of {', '.join(ALLOWED)}, not {value!r}")
    elif key == "judged":
        if value not in ("outside", "inside"):
            raise RubricError(f"{where}: 'judged' must be outside or inside, not {value!r}")
    elif key == "env":
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise RubricError(f"{where}: 'env' must map variable names to values, not {value!r}")


def load_rubric(path, lab=None):
    """The tests of one rubric file, validated (unknown keys and bad values name the file and the entry)."""
    yaml = ensure_yaml()
    path = pathlib.Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise RubricError(f"{path}: not valid YAML: {error}")
    if not isinstance(data, dict):
        raise RubricError(f"{path}: expected a mapping with 'lab' and 'tests'")
    unknown = set(data) - {"lab", "defaults", "tests"}
    if unknown:
        raise RubricError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}; allowed: lab, defaults, tests")
    file_lab = data.get("lab")
    if not isinstance(file_lab, str) or not file_lab:
        raise RubricError(f"{path}: 'lab' (the lab's name) is missing")
    if lab is not None and file_lab != lab:
        raise RubricError(f"{path}: lab '{file_lab}' where '{lab}' was expected")
    defaults = dict(DEFAULTS)
    given_defaults = data.get("defaults") or {}
    if not isinstance(given_defaults, dict):
        raise RubricError(f"{path}: 'defaults' must be a mapping")
    for key, value in given_defaults.items():
        if key not in DEFAULTS and key != "points":
            raise RubricError(f"{path}: defaults: unknown key '{key}'; allowed: points, {', '.join(DEFAULTS)}")
        _check_value(f"{path}: defaults", key, value)
        defaults[key] = value
    entries = data.get("tests")
    if not isinstance(entries, list) or not entries:
        raise RubricError(f"{path}: 'tests' must be a non-empty list")
    tests = []
    for index, entry in enumerate(entries, start=1):
        where = f"{path}: tests[{index}]"
        if not isinstance(entry, dict):
            raise RubricError(f"{where}: expected a mapping with test, todo, points")
        if isinstance(entry.get("test"), str):
            where += f" ({entry['test']})"
        for key in entry:
            if key not in FIELDS:
                raise RubricError(f"{where}: unknown key '{key}'; allowed: {', '.join(FIELDS)}")
        values = dict(defaults)
        values.update(entry)
        for key in ("test", "todo", "points"):
            if key not in values:
                raise RubricError(f"{where}: '{key}' is missing ({FIELDS[key]})")
        for key, value in values.items():
            _check_value(where, key, value)
        if values["partial"] and values["judged"] != "inside":
            raise RubricError(f"{where}: 'partial: true' takes the share the student's own process records: "
                              "only for a test judged inside (judged: inside); a speed test the grader times "
                              "from outside has 'speed:' instead")
        if values["speed"] is not None and (values["partial"] or values["judged"] != "outside"):
            raise RubricError(f"{where}: 'speed' is timed from outside and judged outside: not with 'partial' or "
                              "'judged: inside'")
        for todo in [values["todo"]] + list(values.get("also_needs", [])):
            if not re.fullmatch(re.escape(file_lab) + r"-\d+", todo):
                raise RubricError(f"{where}: TODO id '{todo}' is not of the form {file_lab}-<n>")
        tests.append(RubricTest(lab=file_lab, test=values["test"], todo=values["todo"], points=values["points"],
                                also_needs=list(values.get("also_needs", [])), time_limit_s=values["time_limit_s"],
                                memory_mb=values["memory_mb"],
                                gpus=values["gpus"], visibility=values["visibility"],
                                env={k: str(v) for k, v in values["env"].items()},
                                tags=list(values["tags"]), description=values["description"],
                                speed=values["speed"], partial=values["partial"], allow=list(values["allow"]), judged=values["judged"],
                                source=str(path)))
    return tests


def extra_rubric_files(extra_dir):
    if not extra_dir:
        return []
    extra_dir = pathlib.Path(extra_dir)
    return sorted(list(extra_dir.glob("*.yaml")) + list(extra_dir.glob("*.yml")))


def load_lab_rubric(root, lab, extra_dir=None):
    """labs/<lab>/rubric.yaml plus the rubric files in `extra_dir` that are about this lab."""
    tests = load_rubric(pathlib.Path(root) / "labs" / lab / "rubric.yaml", lab)
    for path in extra_rubric_files(extra_dir):
        tests += [t for t in load_rubric(path) if t.lab == lab]
    return tests


def graded_labs(root):
    """The labs that have a rubric, in name order."""
    return sorted(p.parent.name for p in (pathlib.Path(root) / "labs").glob("*/rubric.yaml"))


def todo_ids(code_dir):
    """The TODO ids marked in a lab's code directory (solution/<lab> or starter/<lab>), in order."""
    ids = []
    for source in sorted(p for p in pathlib.Path(code_dir).iterdir() if p.suffix in (".cpp", ".cu")):
        for line in source.read_text(errors="replace").splitlines():
            match = TODO_MARK.match(line)
            if match and match.group(1) not in ids:
                ids.append(match.group(1))
    return sorted(ids, key=lambda todo: int(todo.rsplit("-", 1)[1]))


def lab_code_dir(root, lab):
    root = pathlib.Path(root)
    return root / "solution" / lab if (root / "solution" / lab).is_dir() else root / "starter" / lab


def list_tests(binary, env=None, cwd=None):
    """Suite.Test names as `<binary> --gtest_list_tests` gives them (parameterized ones in full)."""
    proc = subprocess.run([str(binary), "--gtest_list_tests"], capture_output=True, text=True, timeout=120,
                          env=env, cwd=cwd)
    if proc.returncode != 0:
        raise RubricError(f"{binary} --gtest_list_tests failed (exit {proc.returncode}): "
                          f"{(proc.stdout + proc.stderr)[-1500:]}")
    names, suite = [], None
    for line in proc.stdout.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            suite = line.split("#")[0].strip()
        elif suite:
            names.append(suite + line.split("#")[0].strip())
    return names


def problems(lab, tests, todos, listed):
    """What is wrong between a rubric, the TODOs in the code and the tests in the binary."""
    out = []
    seen = {}
    for t in tests:
        if t.test in seen:
            out.append(f"{t.test}: in the rubric twice ({seen[t.test]} and {t.source})")
        seen[t.test] = t.source
        for todo in t.todos:
            if todo not in todos:
                out.append(f"{t.test}: TODO '{todo}' is not in the code (TODOs of {lab}: {', '.join(todos)})")
        if t.test.split(".", 1)[-1].split("/")[0].endswith("_CUDA") and t.gpus < 1:
            out.append(f"{t.test}: named *_CUDA but the rubric gives it gpus: 0 (it would skip and score nothing)")
        if listed is not None and t.test not in listed:
            out.append(f"{t.test}: in the rubric ({t.source}) but not a test of the binary")
    owners = {t.todo for t in tests}
    for todo in todos:
        if todo not in owners:
            out.append(f"TODO {todo} has no test in the rubric (give it at least one test with todo: {todo})")
    if listed is not None:
        for name in listed:
            if name not in seen:
                out.append(f"{name}: a graded test with no rubric entry (add it to labs/{lab}/rubric.yaml)")
    return out


# ---- outcomes and scores -------------------------------------------------------------------------

@dataclasses.dataclass
class Outcome:
    status: str          # passed | failed | skipped | crashed | timeout
    seconds: float
    message: str = ""    # the first failure line, the skip reason, or what happened to the process
    details: str = ""    # every failure message, then the end of the output
    fraction: float | None = None  # the share of the points a speed or partial test earned, 0..1


NOT_IMPLEMENTED = re.compile(r"TODO\(([a-z0-9_]+-\d+)\) is not implemented yet( \([^)]*\))?")


def first_line(failure_text):
    """'file:line: message' from a gtest failure ('file:line\\nmessage...')."""
    lines = [l for l in failure_text.splitlines() if l.strip()]
    if not lines:
        return "failed"
    todo = NOT_IMPLEMENTED.search(failure_text)
    if todo:
        return f"TODO({todo.group(1)}) is not implemented yet{todo.group(2) or ''}"
    where, rest = lines[0], lines[1:]
    where = where if where != "unknown file" else ""
    if re.match(r".*:\d+$", where):
        where = os.path.basename(where.rsplit(":", 1)[0]) + ":" + where.rsplit(":", 1)[1]
    text = " ".join(l.strip() for l in rest[:6]) if rest else ""  # EXPECT_EQ: both sides and values
    return (where + ": " if where else "") + text


def tail(text, limit=3000):
    return text if len(text) <= limit else "...\n" + text[-limit:]


def speed_share(rule, ratio):
    """The share of a speed test's points (0..1) for `ratio`, the student's time over the reference's,
    by its rubric's `speed` rule."""
    full_within = rule["full_within"]
    if ratio <= full_within:
        return 1.0
    if "none_at" in rule:
        return max(0.0, (rule["none_at"] - ratio) / (rule["none_at"] - full_within))
    return full_within / ratio


def score(test, outcome):
    """The points a test's outcome earns: all of them for a pass, or for a speed or partial test
    points x the share it earned (0 when there is none); 0 otherwise."""
    if outcome.status != "passed":
        return 0
    if test.speed is None and not test.partial:
        return test.points
    return test.points * (outcome.fraction if outcome.fraction is not None else 0.0)
