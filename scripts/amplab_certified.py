"""The certification record: what `scripts/grade --certify` proved, and the inputs it proved it on.

Certifying the rubric runs every graded test on the untouched starter with the test's TODOs emptied
together and each alone, built and judged as a student's code is, and requires every such run to
fail. That is 390 runs and 84 variant builds, about twenty minutes on two cores. A run's verdict is a
function of its inputs, so it is proved once per set of inputs and recorded here, one file per lab,
`tests/certified/<lab>.json`. `scripts/grade --certify` recomputes every run's inputs' digest (in
about a second), takes the recorded verdict of each run whose digest holds, runs again through the
real grading path every run whose digest moved (or that has none, or whose verdict was a problem),
re-runs one more variant picked at random among the reused ones (a spot check: a record that
disagrees with a fresh run is discarded whole), and writes the record again. Commit it with the
change that moved it; CI then reuses it and spot-checks.

What one run's digest covers (`Inputs`), and why its verdict cannot change while the digest holds.
A run is (lab, graded test, emptied TODOs). Its verdict is decided by two binaries and the machine
they run on: the student's test binary of the variant, and the judge. Both are built from:
  - the variant's text: the lab's files with the starter's code in the emptied holes and the
    reference's in the others, exactly as the grader writes them (`variant`);
  - the test: its rubric entry, fully resolved (`rubric`), and its source: the code of the test
    itself (its TEST block) and everything of its file outside any TEST block, with the place of each
    run of TEST blocks marked, so that moving a helper across a test counts (`test`). A file whose
    blocks cannot be told apart (a preprocessor definition inside one, a block the parser cannot
    close) counts as a whole for each of its tests;
  - the lab (`lab`): every file of labs/<lab>/ but its instructor notes and fault cases, apps/<lab>/,
    configs/<lab>.yaml, solution/<lab>/ and starter/<lab>/ whole (the judge links the whole
    reference), and the same of every mechanism lab (lab.yaml `mechanisms: true`) its binaries link
    (those of a lab that trains, lab.yaml `trains: true`);
  - what every lab shares (`core`): src/, cmake/, the CMake files, tests/support/,
    tests/fixtures/, the plotting and registry scripts, every labs/*/lab.yaml;
  - the grader (`grader`): scripts/grade, scripts/amplab_*.py, the untrusted compiler's wrapper,
    make-starter.py (it writes the variants) and tests/grading/;
  - the machine's software (`toolchain`): the C++ compiler, nvcc, torch, Python, and the Debian
    packages the build and the sandbox use (with the dataset), by version.
Each part is a SHA-256 over its files' paths and bytes. Two things a verdict depends on are not in
it: the GPUs (a run that needs more than the machine has is "not checked here" and reruns where they
are), and the optimizer level of the student's code (-Og without a GPU), which cannot turn a run of an
emptied hole into a pass. A change to the core or the grader therefore certifies everything again; a
change to one lab's code, that lab; a change to one test's block, that test.

Trust: the record is sealed (a SHA-256 over its content), so a corrupted or hand-edited file is
caught and discarded whole, never trusted; the seal is no secret (anyone can recompute it), which is
what the spot check answers: every certification re-proves a random variant of the record, and a
verdict that differs discards the record.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import random
import re
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import amplab_labs  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
RECORD_DIR = ROOT / "tests" / "certified"
FORMAT = 1
SEAL_DOMAIN = b"amplab certification record, format 1\n"
# Verdicts of a run that certify it (the test failed with its TODOs emptied); "passed" and
# "build_failed" are problems, "needs_gpu" and "skipped" were not checked where they were recorded.
CERTIFIED = ("failed", "timeout", "crashed", "missing", "killed", "error")
# The Debian packages whose versions the toolchain part names (the build's libraries, the sandbox, the data).
PACKAGES = ("libyaml-cpp-dev", "libspdlog-dev", "libfmt-dev", "libgtest-dev", "libgmock-dev", "libcli11-dev",
            "zlib1g-dev", "nlohmann-json3-dev", "libseccomp-dev", "bubblewrap", "dataset-fashion-mnist", "ninja-build")

CORE_PARTS = ("src/", "cmake/", "CMakeLists.txt", "CMakePresets.json", "apps/CMakeLists.txt",
              "tests/CMakeLists.txt", "tests/labs/CMakeLists.txt", "tests/support/", "tests/fixtures/",
              "scripts/plot.py", "scripts/images.py", "scripts/amplab_labs.py")
GRADER_PARTS = ("scripts/grade", "scripts/amplab-compile-untrusted", "scripts/make-starter.py", "tests/grading/")
LAB_FILES_LEFT_OUT = ("INSTRUCTOR.md", "faults.py")


class RecordError(Exception):
    pass


# ---- the inputs ---------------------------------------------------------------------------------

def tracked_files(root: pathlib.Path) -> list[str]:
    """The repository's files (git's list where there is one; else every file but builds and runs)."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, check=True, timeout=60).stdout
        names = [n for n in out.decode(errors="surrogateescape").split("\0") if n]
        return sorted(n for n in names if (root / n).is_file())
    except (OSError, subprocess.SubprocessError):
        skip = re.compile(r"^(build[^/]*|\.venv|runs|data|\.git|\.device|\.whl)(/|$)|(^|/)__pycache__/")
        return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                      if p.is_file() and not skip.search(str(p.relative_to(root))))


def digest_of(root: pathlib.Path, names) -> str:
    h = hashlib.sha256()
    for name in sorted(names):
        data = (root / name).read_bytes()
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def text_digest(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = part.encode(errors="surrogateescape")
        h.update(f"{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def _version(cmd) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        return (out.stdout or out.stderr).strip()
    except (OSError, subprocess.SubprocessError):
        return "absent"


def toolchain(root: pathlib.Path, build: pathlib.Path | None = None) -> dict:
    """The versions of the machine's software a verdict rests on."""
    compiler = "c++"
    cache = build / "CMakeCache.txt" if build else None
    if cache and cache.is_file():
        for line in cache.read_text(errors="replace").splitlines():
            if line.startswith("CMAKE_CXX_COMPILER:"):
                compiler = line.split("=", 1)[1]
    torch_version = "absent"
    for version_file in sorted(root.glob(".venv/lib/python*/site-packages/torch/version.py")):
        match = re.search(r"__version__\s*=\s*'([^']+)'", version_file.read_text(errors="replace"))
        torch_version = match.group(1) if match else "unknown"
    python = sorted(root.glob(".venv/bin/python3*")) or [pathlib.Path(sys.executable)]
    packages = _version(["dpkg-query", "-W", "-f", "${Package} ${Version}\\n", *PACKAGES])
    nvcc = _version(["nvcc", "--version"]).splitlines()
    return {"c++": _version([compiler, "--version"]).splitlines()[0] if compiler else "absent",
            "nvcc": nvcc[-1] if nvcc else "absent", "torch": torch_version,
            "python": _version([str(python[0]), "--version"]), "packages": packages}


def _under(name: str, parts) -> bool:
    return any(name == p or (p.endswith("/") and name.startswith(p)) for p in parts)


def lab_file_names(files: list[str], lab: str) -> list[str]:
    own = [f"labs/{lab}/", f"apps/{lab}/", f"solution/{lab}/", f"starter/{lab}/", f"configs/{lab}.yaml"]
    return [n for n in files if _under(n, own) and not (n.startswith(f"labs/{lab}/") and
                                                        pathlib.PurePath(n).name in LAB_FILES_LEFT_OUT)]


# ---- a test's own source --------------------------------------------------------------------------

TEST_START = re.compile(r"^[ \t]*(TEST|TEST_F|TEST_P|TYPED_TEST|TYPED_TEST_P)\s*\(\s*(\w+)\s*,\s*(\w+)\s*\)", re.M)


def _block_end(text: str, start: int) -> int | None:
    """The index after the body's closing brace of the block whose header starts at `start`: braces
    counted outside comments, strings, character literals and raw strings. None when unclear."""
    i, n, depth, opened = start, len(text), 0, False
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                return None
            i = j + 2
            continue
        elif c == 'R' and i + 1 < n and text[i + 1] == '"' and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^()\\\s]{0,16})\(', text[i:])
            if not m:
                return None
            j = text.find(")" + m.group(1) + '"', i + m.end())
            if j < 0:
                return None
            i = j + len(m.group(1)) + 2
            continue
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum() and text[i - 1] not in "LUu8":
                i += 1  # a digit separator (1'000)
                continue
            j = i + 1
            while j < n and text[j] != c:
                if text[j] == "\\":
                    j += 1
                elif text[j] == "\n":
                    return None
                j += 1
            i = j + 1
            continue
        elif c == "{":
            depth += 1
            opened = True
        elif c == "}":
            depth -= 1
            if depth < 0:
                return None
            if depth == 0 and opened:
                return i + 1
        i += 1
    return None


def test_sources(text: str) -> dict | None:
    """{Suite.Name: the test's own block} and the file's shared part under the key "" (everything
    outside the blocks, each run of consecutive blocks marked by one line). None when the blocks
    cannot be told apart, so that the whole file counts for every test."""
    blocks, position, shared = {}, 0, []
    for match in TEST_START.finditer(text):
        if match.start() < position:
            return None  # a header inside the previous block
        end = _block_end(text, match.start())
        if end is None:
            return None
        body = text[match.start():end]
        if re.search(r"^\s*#\s*(define|undef)\b", body, re.M):
            return None
        between = text[position:match.start()]
        if between.strip() or not shared:
            shared.append(between)
            shared.append("\n<the file's TEST blocks here>\n")
        key = f"{match.group(2)}.{match.group(3)}"
        if key in blocks:
            return None
        blocks[key] = body
        position = end
    shared.append(text[position:])
    blocks[""] = "".join(shared)
    return blocks


def block_of(blocks: dict, test: str) -> str | None:
    """The block of a rubric test name (a parameterized one is Prefix/Suite.Name/Param)."""
    if test in blocks:
        return blocks[test]
    match = re.fullmatch(r"(?:[\w]+/)?(\w+\.\w+)(?:/\w+)?", test)
    return blocks.get(match.group(1)) if match else None


# ---- one lab's runs' digests -----------------------------------------------------------------------

@dataclasses.dataclass
class Inputs:
    """The digests of the parts every run shares, computed once; each run's from them (entry())."""
    root: pathlib.Path
    extra_dir: pathlib.Path | None
    toolchain: dict = dataclasses.field(default_factory=dict)
    files: list = dataclasses.field(default_factory=list)
    shared: dict = dataclasses.field(default_factory=dict)
    _labs: dict = dataclasses.field(default_factory=dict)
    _tests: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, root, extra_dir, build=None):
        inputs = cls(pathlib.Path(root), pathlib.Path(extra_dir) if extra_dir else None)
        inputs.toolchain = toolchain(inputs.root, build)
        inputs.files = tracked_files(inputs.root)
        inputs.shared = {
            "toolchain": text_digest(json.dumps(inputs.toolchain, sort_keys=True)),
            "core": digest_of(inputs.root, [n for n in inputs.files if _under(n, CORE_PARTS) or
                                            re.fullmatch(r"labs/[^/]+/lab\.yaml", n)]),
            "grader": digest_of(inputs.root, [n for n in inputs.files if _under(n, GRADER_PARTS) or
                                              re.fullmatch(r"scripts/amplab_[^/]*\.py", n)]),
        }
        return inputs

    def lab(self, lab: str) -> str:
        if lab not in self._labs:
            names = set(lab_file_names(self.files, lab))
            for other in amplab_labs.linked_mechanism_labs(lab, self.root):
                names |= set(lab_file_names(self.files, other))
            self._labs[lab] = digest_of(self.root, names)
        return self._labs[lab]

    def test(self, source: pathlib.Path, test: str) -> str:
        source = pathlib.Path(source)
        if source not in self._tests:
            text = source.read_text(errors="surrogateescape")
            self._tests[source] = (text, test_sources(text))
        text, blocks = self._tests[source]
        block = block_of(blocks, test) if blocks is not None else None
        if block is None:
            return text_digest("whole file", text)
        return text_digest("shared part", blocks[""], "block", block)

    def test_files(self, lab: str, t) -> list[pathlib.Path]:
        """The source files of a rubric test: the lab's graded tests, or its hidden ones."""
        if t.source == str(self.root / "labs" / lab / "rubric.yaml") or self.extra_dir is None:
            return [self.root / "tests" / "labs" / f"{lab}_test.cpp"]
        return sorted(self.extra_dir.glob(f"{lab}_*_test.cpp")) + sorted(self.extra_dir.glob("*.yaml"))

    def entry(self, lab: str, t, variant_text: dict) -> dict:
        """The parts of one run (a test of `lab` on one variant's files) and their digest."""
        sources = self.test_files(lab, t)
        test_part = text_digest(*(self.test(s, t.test) if s.suffix == ".cpp" else s.read_text(errors="replace")
                                  for s in sources))
        fields = {k: v for k, v in dataclasses.asdict(t).items() if k not in ("source",)}
        parts = dict(self.shared, lab=self.lab(lab), test=test_part,
                     rubric=text_digest(json.dumps(fields, sort_keys=True, default=str)),
                     variant=text_digest(*(f"{name}\0{text}" for name, text in sorted(variant_text.items()))))
        return {"parts": parts, "digest": text_digest(*(f"{k}={v}" for k, v in sorted(parts.items())))}


# ---- the record -------------------------------------------------------------------------------------

def key_of(test: str, emptied) -> str:
    return f"{test} | {', '.join(emptied)}"


def seal(record: dict) -> str:
    body = {k: v for k, v in record.items() if k != "seal"}
    return hashlib.sha256(SEAL_DOMAIN + json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def record_path(lab: str, record_dir: pathlib.Path = RECORD_DIR) -> pathlib.Path:
    return record_dir / f"{lab}.json"


def load(lab: str, record_dir: pathlib.Path = RECORD_DIR) -> tuple[dict, str]:
    """({key: entry}, a line on what was found): an absent, unreadable, wrongly shaped or unsealed
    record gives no entries, and the line says why."""
    path = record_path(lab, record_dir)
    if not path.exists():
        return {}, f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: no record yet"
    try:
        record = json.loads(path.read_text())
        if not isinstance(record, dict) or record.get("format") != FORMAT or record.get("lab") != lab or \
                not isinstance(record.get("runs"), dict):
            raise RecordError("not a certification record of this lab in format 1")
        if record.get("seal") != seal(record):
            raise RecordError("its seal does not match its content (edited by hand, or corrupted)")
        for key, entry in record["runs"].items():
            if not (isinstance(entry, dict) and isinstance(entry.get("digest"), str) and
                    isinstance(entry.get("status"), str) and isinstance(entry.get("parts"), dict)):
                raise RecordError(f"entry {key!r} is not an entry")
    except (OSError, ValueError, RecordError) as error:
        return {}, f"{path.name} discarded, every run of {lab} is certified again: {error}"
    return record["runs"], f"{path.name}: {len(record['runs'])} recorded run(s)"


def save(lab: str, runs: dict, record_dir: pathlib.Path = RECORD_DIR) -> pathlib.Path:
    record = {"format": FORMAT, "lab": lab,
              "about": "written by scripts/grade --certify (scripts/amplab_certified.py says what it holds); "
                       "never edit it by hand: its seal would not match and the whole record would be certified again",
              "runs": runs}
    record["seal"] = seal(record)
    path = record_path(lab, record_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def moved_parts(old: dict | None, new: dict) -> list[str]:
    """Which parts of a run's inputs differ from the recorded ones (why it is certified again)."""
    if old is None:
        return ["not recorded"]
    return [k for k in sorted(new["parts"]) if old.get("parts", {}).get(k) != new["parts"][k]] or ["digest"]


@dataclasses.dataclass
class Plan:
    reused: dict            # key -> recorded entry (its verdict stands)
    again: dict             # key -> why it runs again (a list of moved parts, or a reason)
    spot_checked: list      # keys of reused entries run again to check the record


def plan(lab: str, current: dict, recorded: dict, gpus: int, needs_gpus: dict, variant_of_key: dict,
         spot_variants: int = 1, rng: random.Random | None = None) -> Plan:
    """Which of a lab's runs (`current`: key -> entry()) take their recorded verdict and which run
    again; `spot_variants` variants of the reused ones that this machine can run are run again too."""
    reused, again = {}, {}
    for key, entry in current.items():
        old = recorded.get(key)
        if old is not None and old.get("digest") == entry["digest"] and old.get("status") in CERTIFIED:
            reused[key] = old
        elif old is not None and old.get("digest") == entry["digest"] and needs_gpus[key] > gpus:
            reused[key] = old  # not checked where it was recorded, nor can it be here
        else:
            why = moved_parts(old, entry) if old is None or old.get("digest") != entry["digest"] else \
                [f"recorded as {old.get('status')}"]
            again[key] = why
    runnable = sorted({variant_of_key[k] for k, old in reused.items()
                       if needs_gpus[k] <= gpus and old.get("status") in CERTIFIED})
    chosen = (rng or random.SystemRandom()).sample(runnable, min(spot_variants, len(runnable))) if runnable else []
    spot = sorted(k for k in reused if variant_of_key[k] in chosen and needs_gpus[k] <= gpus)
    return Plan(reused, again, spot)
