#!/usr/bin/env python3
"""The lead table: amplab's performance rows beside their best PyTorch setups, measured in one
run of bench/lead.sh on one machine, each with its ratio and its target.

    python3 bench/lead.py OUT_DIR           # table.md and lead.json from the runs in OUT_DIR
    python3 bench/lead.py --probe OUT_DIR   # OUT_DIR/machine.json; prints "GPUS FP8 CAPABILITY"
    python3 bench/lead.py --self-test       # this script on run outputs made here, on the CPU

OUT_DIR, as bench/lead.sh writes it (R: the round, 1, 2, ...; W: the number of GPUs):
    machine.json              the GPUs, driver, torch and torchao versions, host, date, commit
    mnist/cpp-R/              the lab binary's run.out_dir (its summary.json), cpp-R.log beside it
    mnist/py-R.json           bench/mnist_reference.py --json (py-R.log beside it)
    gpt/cpp-R/, gpt/py-MODE-R.json     the GPT lab binary; bench/gpt_reference.py, torch.compile MODE
    fp8_mlp/cpp-R/, fp8_mlp/py-R.json  the same binary's FP8 MLP table; bench/fp8_mlp_reference.py
    ddp/cpp-wW-R/, ddp/py-wW-R.json    the lab's bench under amplab-run; bench/ddp_reference.py
    <row>/skipped, ddp/skipped-wW      one line: why that row (world size) did not run
A row folder that is absent was not asked for (lead.sh's ROWS) and has no line in the table.
Each C++ figure is read from the run's summary.json, each Python one from its --json file;
a run with neither is reported as failed, naming its log. Exit status 1 when a run failed.
"""
import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPT_LAB = "transformer_fp8"  # the lab binary of the GPT and FP8 MLP rows

# The targets the table checks each row against.
MNIST_EPOCH_S = 0.07           # the C++ bf16 epoch, seconds
GPT_RATIO = 0.82               # C++ step / the best torch.compile step
GPT_MIN_STEPS = 1000           # both sides timed over at least this many steps
FP8_FASTER_THAN_TORCHAO = 1.10  # torchao's best step / the C++ FP8 step
FP8_OVER_BF16 = 1.74           # the C++ bf16 step / its FP8 step
DDP_EFFICIENCY = {2: 0.96, 4: 0.95}

MNIST_MODE = "gpu-amp (bf16-mixed)"  # the lab's mode whose epoch the row compares
DDP_SETTING = "bucketed, each bucket stepped"  # the lab's reference setting (bench.settings: bucketed_fast)


# ---- Reading the runs ----------------------------------------------------------------------------

def read_json(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def rounds_of(folder, pattern):
    """[(round, path)] of the entries of `folder` whose whole name matches `pattern`, a regex whose
    one group is the round; in round order."""
    found = []
    for path in Path(folder).glob("*"):
        m = re.fullmatch(pattern, path.name)
        if m:
            found.append((int(m.group(1)), path))
    return sorted(found)


def lab_summaries(folder, prefix):
    """[(round, summary)] of the lab runs `prefix`-R/ in `folder` that completed, and the logs of
    those that did not."""
    done, failed = [], []
    for r, run_dir in rounds_of(folder, re.escape(prefix) + r"-(\d+)"):
        if not run_dir.is_dir():
            continue
        summaries = sorted(run_dir.glob("*/*/summary.json"))  # <out_dir>/<lab>/<timestamp>/
        summary = read_json(summaries[-1]) if summaries else None
        if summary and summary.get("status") == "complete":
            done.append((r, summary))
        else:
            failed.append(run_dir.with_name(run_dir.name + ".log"))
    # a run that never made its run directory (refused, out of time) left only its log
    for r, log in rounds_of(folder, re.escape(prefix) + r"-(\d+)\.log"):
        if not log.with_suffix("").is_dir():
            failed.append(log)
    return done, failed


def python_results(folder, pattern, benchmark):
    """[(round, result)] of the --json files `pattern` in `folder` written by `benchmark`, and the
    logs of the runs that wrote none."""
    done, failed = [], []
    for r, path in rounds_of(folder, pattern):
        if path.suffix == ".log":
            if not path.with_suffix(".json").exists():
                failed.append(path)
            continue
        result = read_json(path)
        if result and result.get("benchmark", benchmark) == benchmark and result.get("status", "ok") == "ok":
            done.append((r, result))
        else:
            failed.append(path.with_suffix(".log"))
    return done, failed


def skip_line(log):
    """The reason a run was not started ("" for a run that started), from the first line lead.sh
    writes into its log instead."""
    try:
        first = Path(log).read_text(errors="replace").split("\n", 1)[0]
    except OSError:
        return ""
    return first[len("lead: skipped: "):] if first.startswith("lead: skipped: ") else ""


def failures(out, *log_lists):
    """The logs (relative to OUT_DIR) of the runs that started and left no result."""
    return [os.path.relpath(log, out) for logs in log_lists for log in logs if not skip_line(log)]


def why_not(logs, out):
    """The cell of a side with no figure: the reason its first log gives for a skip, or where to
    look for the failure."""
    for log in logs:
        if skip_line(log):
            return "skipped: " + skip_line(log)
    if logs:
        return "failed: see " + os.path.relpath(logs[0], out)
    return "no run"


def median(values):
    return statistics.median(values) if values else None


def best_variant(series, lower_is_better=True):
    """(name, median) of the series {name: [values per round]} whose median is best."""
    medians = {name: median(v) for name, v in series.items() if v}
    if not medians:
        return None, None
    pick = min if lower_is_better else max
    name = pick(medians, key=medians.get)
    return name, medians[name]


# ---- The rows ------------------------------------------------------------------------------------

def new_row(key, label, target):
    return {"key": key, "label": label, "target": target, "amplab": None, "pytorch": None, "ratio": None,
            "met": None, "skipped": None, "failed_runs": [], "series": {}}


def side(value, text, name=None):
    return {"value": value, "text": text, "name": name}


def missing(row, which, text):
    """Records why a side has no figure (a run failed or was skipped)."""
    row[which] = side(None, text)


def fill_sides(row, out, cpp, cpp_name, cpp_failed, py, py_failed, show, lower_is_better=True):
    """The row's two sides from the C++ rounds `cpp` and the Python series `py` ({setup: [rounds]},
    the best setup taken), each shown by `show(value)`, or why a side has none; the ratio C++ /
    PyTorch when both have one. Returns (C++ median, best PyTorch median), None where missing."""
    ours = median(cpp)
    if cpp:
        row["amplab"] = side(ours, show(ours), cpp_name)
    else:
        missing(row, "amplab", why_not(cpp_failed, out))
    name, best = best_variant(py, lower_is_better)
    if best:
        row["pytorch"] = side(best, f"{show(best)}, {name}", name)
    else:
        missing(row, "pytorch", why_not(py_failed, out))
    if cpp and best:
        row["ratio"] = ours / best
    return ours, best


def skipped_row(folder, name="skipped"):
    path = Path(folder) / name
    return "skipped: " + path.read_text().strip() if path.exists() else None


def mnist_rows(out):
    folder = out / "mnist"
    row = new_row("mnist", "MNIST epoch, bf16 (batch 128)", f"≤ {MNIST_EPOCH_S:g} s")
    if (why := skipped_row(folder)):
        row["skipped"] = why
        return [row]
    summaries, cpp_failed = lab_summaries(folder, "cpp")
    results, py_failed = python_results(folder, r"py-(\d+)\.(?:json|log)", "mnist_reference")
    cpp = [m["seconds_per_epoch"] for _, s in summaries for m in s.get("modes", [])
           if m.get("mode") == MNIST_MODE and m.get("ran")]
    py = {}
    for _, r in results:
        seconds = r.get("warm_epoch_s") or r.get("first_epoch_s")
        if seconds:
            py.setdefault(r.get("variant", "?"), []).append(seconds)
    if summaries and summaries[0][1].get("batch_size"):
        row["label"] = f"MNIST epoch, bf16 (batch {summaries[0][1]['batch_size']})"
    row["series"] = {f"amplab {MNIST_MODE}": cpp, **{f"PyTorch {k}": v for k, v in py.items()}}
    row["failed_runs"] = failures(out, cpp_failed, py_failed)
    ours, _ = fill_sides(row, out, cpp, MNIST_MODE, cpp_failed, py, py_failed, lambda v: f"{v:.3f} s")
    if cpp:
        row["met"] = ours <= MNIST_EPOCH_S
    return [row]


def gpt_rows(out):
    folder = out / "gpt"
    row = new_row("gpt", "GPT step, bf16 (nanoGPT Shakespeare-char)", f"≤ {GPT_RATIO:g}x, ≥ {GPT_MIN_STEPS} steps")
    if (why := skipped_row(folder)):
        row["skipped"] = why
        return [row]
    summaries, cpp_failed = lab_summaries(folder, "cpp")
    results, py_failed = python_results(folder, r"py-[a-z-]+-(\d+)\.(?:json|log)", None)
    cpp, steps = [], []
    for _, s in summaries:
        for p in s.get("precision", []):
            if p.get("row") == "bf16" and p.get("ms_per_step"):
                cpp.append(p["ms_per_step"])
                steps.append(s.get("steps", 0))
    py, py_steps = {}, []
    for _, r in results:
        for p in r.get("results", []):
            if p.get("row") == "bf16-compile" and p.get("ms_per_step") and not math.isnan(p["ms_per_step"]):
                py.setdefault(f"torch.compile {r['args'].get('compile_mode', 'default')}", []).append(p["ms_per_step"])
                py_steps.append(r["args"].get("steps", 0))
    row["series"] = {"amplab bf16": cpp, **{f"PyTorch {k}": v for k, v in py.items()}}
    row["failed_runs"] = failures(out, cpp_failed, py_failed)
    fewest = min(steps + py_steps) if steps + py_steps else 0
    if fewest:
        row["label"] = f"GPT step, bf16 (nanoGPT Shakespeare-char, {fewest} steps)"
    fill_sides(row, out, cpp, "bf16", cpp_failed, py, py_failed, lambda v: f"{v:.2f} ms")
    if row["ratio"] is not None:
        row["met"] = row["ratio"] <= GPT_RATIO and fewest >= GPT_MIN_STEPS
    return [row]


def fp8_series(summaries, results):
    """({name: [ms per round]} of the C++ FP8 MLP table's rows, the same of the Python variants,
    {variant: skip reason})."""
    cpp, py, skipped = {}, {}, {}
    for _, s in summaries:
        for r in s.get("fp8_mlp", []):
            if r.get("ms_per_step"):
                cpp.setdefault(r["name"], []).append(r["ms_per_step"])
    for _, result in results:
        for r in result.get("results", []):
            if r.get("status") == "ok" and r.get("ms_per_step"):
                py.setdefault(r["variant"], []).append(r["ms_per_step"])
            elif r.get("status") == "skipped":
                skipped[r["variant"]] = r.get("skipped_because", "skipped")
    return cpp, py, skipped


def fp8_rows(out):
    folder = out / "fp8_mlp"
    step = new_row("fp8_mlp", "FP8 MLP step, 4 x Linear(8192), batch 8192, fwd + bwd",
                   f"≤ {1 / FP8_FASTER_THAN_TORCHAO:.2f}x ({FP8_FASTER_THAN_TORCHAO:.2f}x faster)")
    speedup = new_row("fp8_mlp_vs_bf16", "FP8 MLP speed-up over its bf16 step", f"≥ {FP8_OVER_BF16:.2f}x")
    if (why := skipped_row(folder)):
        step["skipped"] = speedup["skipped"] = why
        return [step, speedup]
    summaries, cpp_failed = lab_summaries(folder, "cpp")
    results, py_failed = python_results(folder, r"py-(\d+)\.(?:json|log)", "fp8_mlp_reference")
    cpp, py, py_skipped = fp8_series(summaries, results)
    failed = failures(out, cpp_failed, py_failed)
    step["series"] = {**{f"amplab {k}": v for k, v in cpp.items()}, **{f"PyTorch {k}": v for k, v in py.items()}}
    step["failed_runs"] = failed  # the two rows' runs, listed once
    fp8_name, fp8_ms = best_variant({k: v for k, v in cpp.items() if k.startswith("fp8")})
    bf16_ms = median(next((v for k, v in cpp.items() if k.startswith("bf16")), []))
    ao_name, ao_ms = best_variant({k: v for k, v in py.items() if k.startswith(("tensorwise", "rowwise"))})
    py_bf16_name, py_bf16_ms = best_variant({k: v for k, v in py.items() if k.startswith("bf16")})
    no_cpp = why_not(cpp_failed, out) if not summaries else "the lab's run has no FP8 MLP table"
    no_ao = ("skipped: " + next(iter(py_skipped.values()))) if py_skipped and not ao_ms else why_not(py_failed, out)
    if fp8_ms:
        step["amplab"] = side(fp8_ms, f"{fp8_ms:.2f} ms, {fp8_name}", fp8_name)
    else:
        missing(step, "amplab", no_cpp)
    if ao_ms:
        step["pytorch"] = side(ao_ms, f"{ao_ms:.2f} ms, torchao {ao_name}", ao_name)
    else:
        missing(step, "pytorch", no_ao)
    if fp8_ms and ao_ms:
        step["ratio"] = fp8_ms / ao_ms
        step["met"] = ao_ms / fp8_ms >= FP8_FASTER_THAN_TORCHAO
    if fp8_ms and bf16_ms:
        s = bf16_ms / fp8_ms
        speedup["amplab"] = side(s, f"{s:.2f}x ({bf16_ms:.2f} / {fp8_ms:.2f} ms)", fp8_name)
        speedup["met"] = s >= FP8_OVER_BF16
    else:
        missing(speedup, "amplab", no_cpp)
    if ao_ms and py_bf16_ms:
        s = py_bf16_ms / ao_ms
        speedup["pytorch"] = side(s, f"{s:.2f}x, torchao {ao_name} against {py_bf16_name} ({py_bf16_ms:.2f} ms)", ao_name)
    else:
        missing(speedup, "pytorch", no_ao)
    if speedup["amplab"]["value"] and speedup["pytorch"]["value"]:
        speedup["ratio"] = speedup["amplab"]["value"] / speedup["pytorch"]["value"]
    return [step, speedup]


def ddp_setting_name(r):
    return f"bucket_cap_mb={r['bucket_cap_mb']:g}" + (", static_graph" if r.get("static_graph") else "")


def ddp_row(out, world):
    folder = out / "ddp"
    floor = DDP_EFFICIENCY[world]
    row = new_row(f"ddp_w{world}", f"DDP scaling efficiency, fp32 gradients, {world} GPUs", f"≥ {100 * floor:g}%, ahead of PyTorch")
    if (why := skipped_row(folder) or skipped_row(folder, f"skipped-w{world}")):
        row["skipped"] = why
        return row
    summaries, cpp_failed = lab_summaries(folder, f"cpp-w{world}")
    results, py_failed = python_results(folder, rf"py-w{world}-(\d+)\.(?:json|log)", "ddp_reference")
    cpp = [b["efficiency"] for _, s in summaries if s.get("world_size") == world
           for b in s.get("bench", []) if b.get("setting", "").startswith(DDP_SETTING) and b.get("efficiency")]
    py = {}
    for _, r in results:
        for b in r.get("results", []):
            if b.get("setting") == "ddp" and b.get("efficiency"):
                py.setdefault(ddp_setting_name(b), []).append(b["efficiency"])
    row["series"] = {"amplab bucketed, each bucket stepped": cpp, **{f"PyTorch DDP {k}": v for k, v in py.items()}}
    row["failed_runs"] = failures(out, cpp_failed, py_failed)
    ours, best = fill_sides(row, out, cpp, DDP_SETTING, cpp_failed, py, py_failed, lambda v: f"{100 * v:.1f}%",
                            lower_is_better=False)
    if cpp and best:
        row["met"] = ours >= floor and ours > best
    return row


def ddp_rows(out):
    return [ddp_row(out, world) for world in sorted(DDP_EFFICIENCY)]


ROW_BUILDERS = {"mnist": mnist_rows, "gpt": gpt_rows, "fp8_mlp": fp8_rows, "ddp": ddp_rows}


def collect_rows(out):
    rows = []
    for folder, build in ROW_BUILDERS.items():
        if (out / folder).is_dir():
            rows += build(out)
    return rows


# ---- The table -----------------------------------------------------------------------------------

def machine_line(m):
    if not m:
        return "Machine: unknown (no machine.json)"
    gpus = f"{m['gpus']} x {m['gpu_name']}" if m.get("gpus") else f"no CUDA GPU ({m.get('no_gpu_because', '?')})"
    parts = [gpus, f"driver {m.get('driver') or '-'}", f"CUDA {m.get('cuda') or '-'}", f"torch {m.get('torch') or '-'}",
             f"torchao {m.get('torchao') or 'not installed'}", m.get("host", "?"), m.get("date", "?"),
             f"commit {m.get('commit') or '?'}"]
    return "Machine: " + ", ".join(parts)


def cells(row):
    if row["skipped"]:
        return [row["label"], row["skipped"], "", "", row["target"], "-"]
    amplab = row["amplab"]["text"] if row["amplab"] else "-"
    pytorch = row["pytorch"]["text"] if row["pytorch"] else "-"
    ratio = f"{row['ratio']:.2f}x" if row["ratio"] is not None else "-"
    met = {True: "yes", False: "no", None: "-"}[row["met"]]
    return [row["label"], amplab, pytorch, ratio, row["target"], met]


def render(rows, machine, rounds):
    lines = [machine_line(machine), ""]
    lines += ["| row | amplab (C++) | best PyTorch | amplab / PyTorch | target | met? |",
              "| --- | --- | --- | --- | --- | --- |"]
    lines += ["| " + " | ".join(cells(r)) + " |" for r in rows]
    lines += ["", f"amplab: the median of its rounds{f' ({rounds} at most here)' if rounds else ''}; PyTorch: each "
                  "setup's median of its rounds, the best setup shown. amplab / PyTorch: of times (below 1: amplab is faster), of FP8 "
                  "speed-ups and of scaling efficiencies (above 1: amplab is ahead). Scaling efficiency: the MLP "
                  "alone / the MLP under DDP, each side's alone timed in the same processes."]
    runs = [f"- {r['label']}: {name}: " + ", ".join(f"{v:.4g}" for v in values)
            for r in rows for name, values in r["series"].items() if values]
    runs += [f"- {r['label']}: no result from {log}" for r in rows for log in r["failed_runs"]]
    if runs:
        lines += ["", "Every run (ms, s or efficiency, round by round):"] + runs
    return "\n".join(lines) + "\n"


def build_table(out, quiet=False):
    """Prints the table (unless quiet), writes table.md and lead.json; 1 when a run failed."""
    out = Path(out)
    if not out.is_dir():
        sys.exit(f"lead: {out} is not a directory (bench/lead.sh writes it)")
    machine = read_json(out / "machine.json")
    rows = collect_rows(out)
    if not rows:
        sys.exit(f"lead: no row folder in {out} (mnist, gpt, fp8_mlp, ddp)")
    rounds = max((len(v) for r in rows for v in r["series"].values()), default=0)
    text = render(rows, machine, rounds)
    (out / "table.md").write_text(text)
    (out / "lead.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=1) + "\n")
    if not quiet:
        print(text, end="")
    return 1 if any(r["failed_runs"] for r in rows) else 0


# ---- The machine ---------------------------------------------------------------------------------

def run_text(command):
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=30, cwd=ROOT).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def probe(out):
    """Writes OUT/machine.json and prints "GPUS FP8 CAPABILITY" (FP8: 1 where the first GPU has
    FP8 matmuls, compute capability 8.9 or above) for bench/lead.sh, alone on stdout."""
    with contextlib.redirect_stdout(sys.stderr):  # whatever the imports print
        m = machine()
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "machine.json").write_text(json.dumps(m, indent=1) + "\n")
    print(m["gpus"], int(m["fp8"]), m["capability"] or "-")


def machine():
    """This machine: its GPUs (torch's view), driver, CUDA, torch and torchao, host, date, commit."""
    m = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "host": platform.node(),
         "python": sys.executable, "commit": run_text(["git", "rev-parse", "--short=12", "HEAD"]) or None,
         "driver": run_text(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]).split("\n")[0] or None,
         "gpus": 0, "fp8": False, "capability": None}
    try:
        import torch
        m.update(torch=torch.__version__, cuda=torch.version.cuda)
        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            capability = torch.cuda.get_device_capability(0)
            m.update(gpus=torch.cuda.device_count(), gpu_name=torch.cuda.get_device_name(0),
                     capability="%d.%d" % capability, fp8=capability >= (8, 9))
        else:
            m["no_gpu_because"] = f"torch {torch.__version__} sees none"
    except ImportError as e:
        m.update(torch=None, no_gpu_because=f"torch not importable by {sys.executable}: {e}")
    try:
        import torchao
        m["torchao"] = torchao.__version__
    except Exception:  # absent, or built for another torch
        m["torchao"] = None
    return m


# ---- Self-test -----------------------------------------------------------------------------------

# Stand-ins that let the self-test run lead.sh's control flow without a GPU: each records its
# command line into $FAKE_DIR/commands and leaves a prepared result where the real run would.
STUB_LAB = r'''#!/usr/bin/env bash
# A lab binary: a prepared summary.json into run.out_dir/<lab>/<timestamp>/.
lab=$(basename "$0")
echo "$lab $*" >>"$FAKE_DIR/commands"
for a in "$@"; do [[ "$a" != run.out_dir=* ]] || out="${a#run.out_dir=}"; done
src="$FAKE_DIR/$lab.summary.json"
[[ "$*" != *"study.rows=[]"* ]] || src="$FAKE_DIR/fp8.summary.json"
mkdir -p "$out/$lab/20260101-000000"
sed "s/\"world_size\": [0-9]*/\"world_size\": ${FAKE_WORLD:-1}/" "$src" >"$out/$lab/20260101-000000/summary.json"
'''
STUB_LAUNCHER = r'''#!/usr/bin/env bash
# amplab-run: the ranks' command once, with the world size it was given.
while [[ "$1" != -- ]]; do [[ "$1" != --nproc-per-node ]] || export FAKE_WORLD="$2"; shift; done
shift
echo "amplab-run $FAKE_WORLD" >>"$FAKE_DIR/commands"
exec "$@"
'''
STUB_PYTHON = r'''#!/usr/bin/env bash
# python: bench/lead.py, side_by_side.py, -c and pip for real (the probe reporting 4 GPUs with
# FP8); a reference script leaves its prepared --json.
case "$1" in
  bench/lead.py) [[ "$2" != --probe ]] || { "$FAKE_REAL_PYTHON" "$@" >/dev/null && echo "4 1 9.0"; exit; } ;&
  bench/side_by_side.py | -c) exec "$FAKE_REAL_PYTHON" "$@" ;;
  -m) [[ "$2" != pip ]] || exec "$FAKE_REAL_PYTHON" "$@" ;;
esac
echo "python $*" >>"$FAKE_DIR/commands"
prev="" mode=""
for a in "$@"; do
  [[ "$a" != bench/*_reference.py ]] || ref=$(basename "$a" .py)
  [[ "$prev" != --json ]] || json="$a"
  [[ "$prev" != --compile-mode ]] || mode=".$a"
  prev="$a"
done
cp "$FAKE_DIR/$ref$mode.json" "$json"
'''


def load(path):
    return json.loads(Path(path).read_text())


class SelfTest:
    """Makes real outputs of each side on the CPU (the lab binaries and the Python references at
    tiny sizes) and edits them into what the GPU runs give; then checks the table made from two
    rounds of them with chosen figures, the skipped and failed cases, and lead.sh's control flow
    with stand-ins for the binaries and Python that leave those outputs."""

    def __init__(self, bin_dir, keep):
        self.bin = Path(bin_dir).resolve()
        self.tmp = Path(tempfile.mkdtemp(prefix="lead-self-test-"))
        self.keep = keep
        self.python = sys.executable

    def sh(self, *command, env=None):
        result = subprocess.run([str(c) for c in command], cwd=ROOT, capture_output=True, text=True,
                                env={**os.environ, **(env or {})}, timeout=300)
        if result.returncode != 0:
            raise AssertionError(f"{' '.join(map(str, command))} exited {result.returncode}:\n"
                                 f"{result.stdout[-3000:]}{result.stderr[-3000:]}")
        return result

    def lab(self, name, out_dir, *settings, ranks=0):
        """Runs a lab binary on the CPU; the summary.json it wrote."""
        command = [self.bin / name, "--set", "run.device=cpu", "--set", f"run.out_dir={out_dir}", *settings]
        if ranks:
            command = [self.bin / "amplab-run", "--nproc-per-node", str(ranks), "--", *command]
        self.sh(*command)
        return sorted(Path(out_dir).glob("*/*/summary.json"))[-1]

    def real_outputs(self):
        """{name: path} of one real output of every kind of run lead.sh makes, at tiny sizes on the CPU."""
        t, py = self.tmp / "real", self.python
        text = (ROOT / "tests/fixtures/shakespeare_tiny.txt").read_text()
        (t / "text").mkdir(parents=True)
        (t / "text/train.txt").write_text(text[: len(text) * 9 // 10])
        (t / "text/val.txt").write_text(text[len(text) * 9 // 10:])
        tiny_gpt = ["--set", "gpt.n_layer=1", "--set", "gpt.n_head=2", "--set", "gpt.n_embd=32", "--set", "gpt.block_size=32",
                    "--set", "gpt.batch=4", "--set", f"data.dir={t / 'text'}", "--set", "study.attention_study=false",
                    "--set", "study.sample_tokens=0", "--set", "study.plots=false"]
        real = {"gpt_cpp": self.lab(GPT_LAB, t / "gpt", *tiny_gpt, "--set", "study.rows=[bf16]", "--set", "study.steps=15",
                                    "--set", "study.eval_every=15", "--set", "study.eval_iters=1",
                                    "--set", "study.lr_warmup_steps=2", "--set", "study.fp8_mlp=false"),
                "fp8_cpp": self.lab(GPT_LAB, t / "fp8", *tiny_gpt, "--set", "study.rows=[]")}
        self.sh(py, "bench/gpt_reference.py", "--device", "cpu", "--data", t / "text", "--n-layer", "1", "--n-head", "2",
                "--n-embd", "32", "--block-size", "32", "--batch", "4", "--steps", "15", "--eval-every", "15",
                "--eval-iters", "1", "--lr-warmup", "2", "--rows", "bf16", "--json", t / "gpt.json")
        self.sh(py, "bench/fp8_mlp_reference.py", "--device", "cpu", "--width", "32", "--batch", "32", "--steps", "2",
                "--variants", "bf16,tensorwise", "--json", t / "fp8.json")
        real["mnist_cpp"] = self.lab("mnist", t / "mnist", "--set", "mnist.modes=[cpu]", "--set", "data.train_limit=1000",
                                     "--set", "data.test_limit=200", "--set", "mnist.plots=false",
                                     "--set", "mnist.profile_steps=0")
        flags = self.sh(py, "bench/side_by_side.py", "--reference-flags", real["mnist_cpp"]).stdout.split()
        self.sh(py, "bench/mnist_reference.py", "--device", "cpu", "--epochs", "2", "--limit", "512", "--test-limit", "200",
                *flags, "--json", t / "mnist.json")
        real["ddp_cpp"] = self.lab("ddp", t / "ddp", "--set", "bench.enabled=true", "--set", "bench.width=128",
                                   "--set", "bench.batch=32", "--set", "bench.steps=3", "--set", "bench.warmup=1",
                                   "--set", "dist.bucket_mb=1", "--set", "bench.settings=[bucketed_fast]", ranks=2)
        self.sh(py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "bench/ddp_reference.py",
                "--device", "cpu", "--width", "64", "--batch", "16", "--steps", "2", "--warmup", "1", "--alone-first",
                "--bucket-cap-mb", "25,100", "--static-graph", "both", "--json", t / "ddp.json")
        real.update(mnist_py=t / "mnist.json", gpt_py=t / "gpt.json", fp8_py=t / "fp8.json", ddp_py=t / "ddp.json")
        return real

    @staticmethod
    def gpu_like(real):
        """{name: data} of the real outputs edited into what the GPU runs give: the lab's gpu-amp
        mode, an FP8 MLP table (in the columns fp8_tables.cpp writes), the Python setups' names."""
        g = {k: load(v) for k, v in real.items()}
        g["mnist_cpp"]["modes"][0]["mode"] = MNIST_MODE
        g["mnist_py"]["variant"] = "cuda bf16-mixed resident cuda-graph"
        g["gpt_cpp"]["steps"] = 1000
        g["gpt_py"]["results"][0]["row"] = "bf16-compile"
        g["gpt_py"]["args"].update(steps=1000, compile_mode="reduce-overhead")
        g["fp8_cpp"]["fp8_mlp"] = [{"name": n, "ms_per_step": 10.0, "tflops": 1.0, "vs_bf16": 1.0, "fit_loss": 0.1,
                                    "loss_vs_bf16": 0.0} for n in ("bf16 (autocast)", "fp8 (your fp8_linear, dynamic)",
                                                                   "fp8 (your fp8_linear, delayed)")]
        assert [r["variant"] for r in g["fp8_py"]["results"]] == ["bf16", "tensorwise"], g["fp8_py"]["results"]
        template = g["fp8_py"]["results"][0]
        g["fp8_py"]["results"] = [{**template, "variant": v, "status": "ok"}
                                  for v in ("bf16", "bf16-compile", "tensorwise-compile", "rowwise-compile")]
        return g

    @staticmethod
    def lab_copy(real_summary, run_dir, data):
        """A copy of a real lab run (its whole run.out_dir) at run_dir, holding `data` as its summary.json."""
        src = Path(real_summary).parent.parent.parent
        shutil.copytree(src, run_dir)
        (run_dir / Path(real_summary).relative_to(src)).write_text(json.dumps(data))

    @staticmethod
    def json_copy(dst, data):
        Path(dst).write_text(json.dumps(data))
        Path(dst).with_suffix(".log").write_text("(the run's output)\n")

    def fill(self, real, g, out):
        """OUT_DIR as two rounds of lead.sh on 2 GPUs leave it, with chosen figures."""
        for d in ("mnist", "gpt", "fp8_mlp", "ddp"):
            (out / d).mkdir(parents=True)
        for r, (c, p) in enumerate([(0.10, 0.25), (0.12, 0.27)], 1):
            g["mnist_cpp"]["modes"][0]["seconds_per_epoch"], g["mnist_py"]["warm_epoch_s"] = c, p
            self.lab_copy(real["mnist_cpp"], out / f"mnist/cpp-{r}", g["mnist_cpp"])
            self.json_copy(out / f"mnist/py-{r}.json", g["mnist_py"])
        (out / "mnist/cpp-3.log").write_text("error: the GPU fell off the bus\n")  # a third round that failed
        for r, (c, p) in enumerate([(6.0, 7.4), (6.2, 7.3)], 1):
            g["gpt_cpp"]["precision"][0]["ms_per_step"], g["gpt_py"]["results"][0]["ms_per_step"] = c, p
            self.lab_copy(real["gpt_cpp"], out / f"gpt/cpp-{r}", g["gpt_cpp"])
            self.json_copy(out / f"gpt/py-reduce-overhead-{r}.json", g["gpt_py"])
        g["gpt_py"]["results"][0]["ms_per_step"] = 12.8
        self.json_copy(out / "gpt/py-default-1.json", {**g["gpt_py"], "args": {**g["gpt_py"]["args"], "compile_mode": "default"}})
        for r, (c, p) in enumerate([((19.0, 11.0, 11.5), (19.5, 18.9, 12.4, 13.9)), ((19.2, 11.2, 11.6), (19.5, 18.9, 12.4, 13.9))], 1):
            for row, ms in zip(g["fp8_cpp"]["fp8_mlp"] + g["fp8_py"]["results"], c + p):
                row["ms_per_step"] = ms
            self.lab_copy(real["fp8_cpp"], out / f"fp8_mlp/cpp-{r}", g["fp8_cpp"])
            self.json_copy(out / f"fp8_mlp/py-{r}.json", g["fp8_py"])
        # the Python settings: bucket_cap_mb 25, 25 static_graph, 100, 100 static_graph
        for r, (c, p) in enumerate([(0.965, (0.898, 0.905, 0.902, 0.91)), (0.967, (0.900, 0.906, 0.90, 0.912))], 1):
            g["ddp_cpp"]["bench"][1]["efficiency"] = c
            for b, e in zip(g["ddp_py"]["results"][1:], p):
                b["efficiency"] = e
            self.lab_copy(real["ddp_cpp"], out / f"ddp/cpp-w2-{r}", g["ddp_cpp"])
            self.json_copy(out / f"ddp/py-w2-{r}.json", g["ddp_py"])
        (out / "ddp/skipped-w4").write_text("needs 4 GPUs, 2 here\n")
        (out / "machine.json").write_text(json.dumps({"gpus": 2, "gpu_name": "NVIDIA H100 80GB HBM3", "driver": "570.0",
                                                      "cuda": "13.0", "torch": "2.11.0", "torchao": "0.18.0", "host": "test",
                                                      "date": "2026-01-01 00:00 UTC", "commit": "abc"}))

    @staticmethod
    def check_rows(out):
        rows = {r["key"]: r for r in load(out / "lead.json")["rows"]}
        table = (out / "table.md").read_text()

        def near(a, b):
            assert a is not None and abs(a - b) < 1e-9, (a, b)

        near(rows["mnist"]["amplab"]["value"], 0.11)
        near(rows["mnist"]["pytorch"]["value"], 0.26)
        near(rows["mnist"]["ratio"], 0.11 / 0.26)
        assert rows["mnist"]["met"] is False and rows["mnist"]["failed_runs"] == ["mnist/cpp-3.log"], rows["mnist"]
        near(rows["gpt"]["ratio"], 6.1 / 7.35)
        assert rows["gpt"]["pytorch"]["name"] == "torch.compile reduce-overhead" and rows["gpt"]["met"] is False
        near(rows["fp8_mlp"]["amplab"]["value"], 11.1)
        near(rows["fp8_mlp"]["pytorch"]["value"], 12.4)
        assert rows["fp8_mlp"]["pytorch"]["name"] == "tensorwise-compile" and rows["fp8_mlp"]["met"] is True
        near(rows["fp8_mlp_vs_bf16"]["amplab"]["value"], 19.1 / 11.1)
        near(rows["fp8_mlp_vs_bf16"]["pytorch"]["value"], 18.9 / 12.4)
        assert rows["fp8_mlp_vs_bf16"]["met"] is False
        near(rows["ddp_w2"]["amplab"]["value"], 0.966)
        near(rows["ddp_w2"]["pytorch"]["value"], 0.911)
        assert rows["ddp_w2"]["pytorch"]["name"] == "bucket_cap_mb=100, static_graph" and rows["ddp_w2"]["met"] is True
        assert rows["ddp_w4"]["skipped"] == "skipped: needs 4 GPUs, 2 here"
        for text in ("2 x NVIDIA H100 80GB HBM3, driver 570.0", "| 0.42x | ≤ 0.07 s | no |", "| 0.83x | ≤ 0.82x, ≥ 1000 steps | no |",
                     "| 96.6% | 91.1%, bucket_cap_mb=100, static_graph | 1.06x |", "skipped: needs 4 GPUs, 2 here",
                     "no result from mnist/cpp-3.log"):
            assert text in table, f"{text!r} not in the table:\n{table}"

    def check_missing_sides(self, real, g, out):
        """Without torchao, with Python runs that failed, and on a machine without a GPU."""
        self.json_copy(out / "fp8_mlp/py-1.json", load(real["fp8_py"]))  # tensorwise skipped where torchao is absent
        (out / "fp8_mlp/py-2.json").unlink()
        for f in out.glob("gpt/py-*.json"):
            f.unlink()  # their logs stay: failed runs
        assert build_table(out, quiet=True) == 1
        rows = {r["key"]: r for r in load(out / "lead.json")["rows"]}
        assert rows["gpt"]["pytorch"]["text"] == "failed: see gpt/py-default-1.log", rows["gpt"]["pytorch"]
        if load(real["fp8_py"])["torchao"] is None:
            assert rows["fp8_mlp"]["pytorch"]["text"].startswith("skipped: torchao not installed"), rows["fp8_mlp"]
        nothing = self.tmp / "no-gpu"
        for d in ("mnist", "gpt", "fp8_mlp", "ddp"):
            (nothing / d).mkdir(parents=True)
            (nothing / d / "skipped").write_text("no CUDA GPU\n")
        assert build_table(nothing, quiet=True) == 0
        rows = load(nothing / "lead.json")["rows"]
        assert len(rows) == 6 and all(r["skipped"] == "skipped: no CUDA GPU" for r in rows), rows

    def lead_sh(self, out, **env):
        return subprocess.run(["bash", "bench/lead.sh", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHON": self.python, "BIN": str(self.bin), "TMPDIR": str(self.tmp), **env})

    def check_lead_sh_without_gpu(self):
        """lead.sh here, where there is no GPU: every row skipped, exit 0."""
        result = self.lead_sh(self.tmp / "lead-sh")
        assert result.returncode == 0, result.stdout + result.stderr
        rows = load(self.tmp / "lead-sh/lead.json")["rows"]
        assert len(rows) == 6 and all(r["skipped"] for r in rows), result.stdout

    def stubs(self, g):
        """A bin folder and a python of stand-ins (STUB_*) and $FAKE_DIR with the outputs they leave."""
        fake = self.tmp / "fake"
        (fake / "bin").mkdir(parents=True)
        for name in ("mnist", GPT_LAB, "ddp"):
            (fake / "bin" / name).write_text(STUB_LAB)
        (fake / "bin/amplab-run").write_text(STUB_LAUNCHER)
        (fake / "python").write_text(STUB_PYTHON)
        for f in [*(fake / "bin").iterdir(), fake / "python"]:
            f.chmod(0o755)
        prepared = {"mnist.summary": "mnist_cpp", f"{GPT_LAB}.summary": "gpt_cpp", "fp8.summary": "fp8_cpp",
                    "ddp.summary": "ddp_cpp", "mnist_reference": "mnist_py", "gpt_reference.reduce-overhead": "gpt_py",
                    "fp8_mlp_reference": "fp8_py", "ddp_reference": "ddp_py"}
        for name, key in prepared.items():
            (fake / f"{name}.json").write_text(json.dumps(g[key]))
        default = {**g["gpt_py"], "args": {**g["gpt_py"]["args"], "compile_mode": "default"}}
        (fake / "gpt_reference.default.json").write_text(json.dumps(default))
        return fake

    def check_lead_sh_flow(self, g):
        """lead.sh on a make-believe 4-GPU machine: the runs in order, the table from their outputs;
        then with no time left, every run not started and saying so."""
        fake = self.stubs(g)
        env = {"PYTHON": str(fake / "python"), "BIN": str(fake / "bin"), "FAKE_DIR": str(fake),
               "FAKE_REAL_PYTHON": self.python, "SHAKESPEARE_DIR": str(self.tmp / "real/text")}
        result = self.lead_sh(self.tmp / "flow", **env)
        assert result.returncode == 0, result.stdout + result.stderr
        commands = (fake / "commands").read_text().splitlines()
        ran = [m.group(0) if (m := re.search(r"bench/\w+\.py", c)) else c.split()[0] for c in commands]
        gpt, fp8, lab_ddp = ["bench/gpt_reference.py"], ["bench/fp8_mlp_reference.py"], ["bench/ddp_reference.py"]
        expected = (["mnist", "bench/mnist_reference.py"] * 2
                    + [GPT_LAB] + gpt * 2 + [GPT_LAB] + gpt + ([GPT_LAB] + fp8) * 2
                    + (["amplab-run", "ddp"] + lab_ddp) * 4)
        assert ran == expected, "\n".join(commands)
        assert "--compile-mode reduce-overhead" in commands[5] and "--compile-mode default" in commands[6], commands[5:7]
        assert commands[-3] == "amplab-run 4" and "--nproc-per-node 4" in commands[-1], commands[-3:]
        rows = load(self.tmp / "flow/lead.json")["rows"]
        assert [r["ratio"] is not None for r in rows] == [True] * 6, rows
        if list((ROOT / ".whl").glob("torchao-*.whl")):  # installed by lead.sh from the wheel
            assert load(self.tmp / "flow/machine.json")["torchao"], "torchao not installed from .whl/"
        result = self.lead_sh(self.tmp / "late", **env, DEADLINE_S="1", ROWS="gpt ddp")
        assert result.returncode == 0, result.stdout + result.stderr
        rows = load(self.tmp / "late/lead.json")["rows"]
        assert rows[0]["amplab"]["text"] == "skipped: out of time (DEADLINE_S=1)", rows[0]
        assert len(rows) == 3 and all(r["ratio"] is None for r in rows), rows

    def run(self):
        try:
            import torch
            has_gpu = torch.cuda.is_available()
        except ImportError:
            sys.exit("lead --self-test: needs torch")
        print(f"lead --self-test: in {self.tmp}, about a minute", flush=True)
        real = self.real_outputs()
        g = self.gpu_like(real)
        self.check_lead_sh_flow(json.loads(json.dumps(g)))
        out = self.tmp / "out"
        self.fill(real, g, out)
        assert build_table(out, quiet=True) == 1  # the failed third MNIST round
        self.check_rows(out)
        self.check_missing_sides(real, g, out)
        if has_gpu:
            print("lead --self-test: a GPU is here; lead.sh without one not tried")
        else:
            self.check_lead_sh_without_gpu()
        print("lead --self-test: passed")
        if not self.keep:
            shutil.rmtree(self.tmp)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    p.add_argument("out_dir", nargs="?")
    p.add_argument("--probe", action="store_true", help="write OUT_DIR/machine.json and print GPUS FP8 CAPABILITY")
    p.add_argument("--self-test", action="store_true", help="check this script on outputs made here on the CPU")
    p.add_argument("--bin", default=os.environ.get("BIN", str(ROOT / "build/bin")), help="the lab binaries (--self-test)")
    p.add_argument("--keep", action="store_true", help="--self-test: keep its temporary folder")
    a = p.parse_args()
    if a.self_test:
        SelfTest(a.bin, a.keep).run()
        return 0
    if not a.out_dir:
        p.error("OUT_DIR is needed")
    if a.probe:
        probe(a.out_dir)
        return 0
    return build_table(a.out_dir)


if __name__ == "__main__":
    sys.exit(main())
