#!/usr/bin/env python3
"""The fault sweep: bad input and faults thrown at the lab binaries as users would meet them.

    tests/faults/sweep.py                       every case, 2 at a time, binaries in build/bin
    tests/faults/sweep.py --only signal         the cases whose name contains 'signal'
    tests/faults/sweep.py --only cli/,yaml/     several (ctest fault_sweep_command_line runs these)
    tests/faults/sweep.py --list                the cases' names, one a line, without running them
    tests/faults/sweep.py --bin DIR --jobs 4 --out sweep.json

Each case runs a binary (or two, or a launcher) with a timeout and is judged:
  crash    killed by a signal we did not send, exit 134/136/139, or 'terminate called',
           'Segmentation fault', 'core dumped' in its output;
  hang     still running at its timeout (the whole process group is then killed);
  lost     a resumed run ends elsewhere than the same run uninterrupted (metrics.csv's last
           epoch: train loss, test accuracy, test loss), or a checkpoint that should load does not;
  unclear  bad input accepted (exit 0), or refused with anything but one 'error:' line naming
           what was wrong (the key, the file, the rank);
  wrong    silently something else than what was asked (a value cut short, a file in another
           place): exit 0 with the wrong result;
  skipped  the machine cannot stage it (no tmpfs for the full disk): counted apart, not passed.
Prints a table (cases tried, crashes, hangs, data lost, silent wrong, unclear messages, skipped) and a line per
failed case; exit 1 when any case failed. Standard library only; CPU only.

Where the cases are. This file is the harness (running a case, judging it, the report) and holds
the cases every lab meets alike, looped over the labs registered in labs/<lab>/lab.yaml (read
through scripts/amplab_labs.py). A lab's own cases, and what those loops need to know of it, are
in labs/<lab>/faults.py, loaded when it exists (instructor-only: hand-outs leave it out). It
imports its tools from this file (`from sweep import Case, run, refused`) and may state:
    cases(ctx)          the lab's own cases, a list of Case; ctx is a Context (the binaries' folder,
                        the folder cases write under, the settings of every lab's faults.py)
    RESUMES             true when the lab saves checkpoints: cli/<lab>/--resume of a missing file,
                        and of 'latest' with no checkpoint
    BEYOND_THE_MACHINE  [(assignment, names, what)]: a value in its range that the machine or the
                        libraries cannot honour, refused naming each of `names` (cli/<lab>/--set <what>)
    STOP                {"settings": [--set ...], "after": a regular expression, "when": words}:
                        Ctrl-C and SIGTERM once a line of the run's output matches `after`
                        (stop/<lab>/SIGINT <when>)
    QUICK_CHECKPOINT    the --set list of a CPU run of seconds that leaves a checkpoint (another
                        lab's checkpoint, for the labs that refuse one)
"""
import argparse
import concurrent.futures
import importlib.util
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import amplab_labs  # noqa: E402

sys.modules.setdefault("sweep", sys.modules[__name__])  # the labs' faults.py import this file as `sweep`
LABS = [lab.name for lab in amplab_labs.labs_or_exit()]  # labs/<lab>/lab.yaml, in course order
CRASH_TEXT = re.compile(r"terminate called|Segmentation fault|core dumped|Aborted \(core|double free|stack smashing")
LOG_LINE = re.compile(r"^(\[rank \d+\] )?\[\d\d:\d\d:\d\d (trace|debug|info|warn|warning)\]")
ERROR_LINE = re.compile(r"^(\[rank \d+\] )?error: ")


class Case:
    """One case: its name ('<category>/...', what --only matches), its category (the report's rows),
    `run`, which runs it and returns (verdict, detail, command), and its timeout in seconds."""

    def __init__(self, name, category, run, timeout=60):
        self.name, self.category, self.run_fn, self.timeout = name, category, run, timeout


class Result:
    def __init__(self, case, verdict, detail="", command="", seconds=0.0):
        self.case, self.verdict, self.detail, self.command, self.seconds = case, verdict, detail, command, seconds


def run(argv, timeout, env=None, cwd=None, signals=()):
    """Runs argv in its own session; `signals`: (seconds after start, signal, pattern or None) sent to
    the group (pattern None) or to the processes whose environment has RANK=<pattern>. Returns
    (rc or None on timeout, output, seconds)."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                            start_new_session=True, text=True, errors="replace")
    out_chunks = []
    reader = threading.Thread(target=lambda: out_chunks.append(proc.stdout.read()), daemon=True)
    reader.start()
    for at, sig, rank in signals:
        delay = at - (time.monotonic() - start)
        if delay > 0:
            try:
                proc.wait(delay)
                break  # ended before the signal
            except subprocess.TimeoutExpired:
                pass
        if rank is None:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
        else:
            for pid in pids_with_rank(proc.pid, rank):
                os.kill(pid, sig)
    try:
        rc = proc.wait(max(0.1, timeout - (time.monotonic() - start)))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        rc = None
    reader.join(5)
    return rc, "".join(out_chunks), time.monotonic() - start


def descendants(root):
    """Every process below `root` (launchers may start their workers in sessions of their own)."""
    children = {}
    for proc in pathlib.Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(proc.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def pids_with_rank(root, rank):
    """The lab workers below `root` whose environment says RANK=<rank> (not the launchers)."""
    found = []
    for pid in descendants(root):
        try:
            environ = pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ and "python" not in pathlib.Path(exe).name \
                and not exe.endswith("amplab-run"):
            found.append(pid)
    return found


def crashed(rc, out, sent=()):
    if rc is not None and rc < 0 and -rc not in sent:
        return f"killed by signal {-rc}"
    if rc in (134, 136, 139):
        return f"exit {rc}"
    match = CRASH_TEXT.search(out)
    return f"'{match.group(0)}' in the output" if match else ""


def judge_error(rc, out, names, cmd):
    """Bad input: a non-zero exit and exactly one 'error:' line that names each of `names`."""
    if rc is None:
        return "hang", "no exit", cmd
    crash = crashed(rc, out)
    if crash:
        return "crash", crash, cmd
    if rc == 0:
        return "unclear", "exit 0 on bad input", cmd
    errors = [line for line in out.splitlines() if ERROR_LINE.match(line)]
    others = [line for line in out.splitlines()
              if line.strip() and not LOG_LINE.match(line) and not ERROR_LINE.match(line)]
    if len(errors) != 1:
        return "unclear", f"{len(errors)} error lines: {out.strip()[-300:]!r}", cmd
    if others:
        return "unclear", f"more than the error line: {others[0][:200]!r}", cmd
    missing = [n for n in names if n not in errors[0]]
    if missing:
        return "unclear", f"error line does not name {missing}: {errors[0][:300]!r}", cmd
    return "ok", errors[0][:200], cmd


def refused(cmd, names, timeout=60):
    """Runs bad input and judges the refusal (judge_error)."""
    rc, out, _ = run(cmd, timeout)
    return judge_error(rc, out, names, " ".join(cmd))



def run_stopped_at(argv, pattern, sig, timeout):
    """Runs argv in its own session and sends `sig` to its group when a line of its output matches
    `pattern` (a Ctrl-C at a known moment). Returns (rc or None on timeout, output, whether sent)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, text=True,
                            errors="replace")
    lines, sent = [], threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if not sent.is_set() and re.search(pattern, line):
                sent.set()
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        rc = None
    reader.join(5)
    return rc, "".join(lines), sent.is_set()


def newest_run(out_dir, lab):
    runs = sorted(pathlib.Path(out_dir).glob(f"{lab}/2*/"), key=lambda p: p.stat().st_mtime)
    return runs[-1] if runs else None


def stopped_well(rc, out, sent, sig, out_dir, lab, cmd):
    """A run stopped by a signal: 128 + signal, one line saying where it stopped and how to go on,
    summary.json and report.md written, marked partial unless the work was done."""
    if rc is None:
        return "hang", "no exit after the signal", cmd
    crash = crashed(rc, out, sent=(sig,))
    if crash or "Traceback" in out:
        return "crash", crash or "a Python traceback in the output (the plot child died of the signal)", cmd
    if not sent:
        return "unclear", "the moment to send the signal never came: " + out.strip()[-200:], cmd
    if rc != 128 + sig:
        return "unclear", f"exit {rc}, not {128 + sig}: {out.strip()[-300:]!r}", cmd
    run_dir = newest_run(out_dir, lab)
    if run_dir is None or not (run_dir / "summary.json").exists() or not (run_dir / "report.md").exists():
        return "lost", f"no summary.json or report.md in {run_dir}", cmd
    summary = json.loads((run_dir / "summary.json").read_text())
    stopped_lines = [line for line in out.splitlines() if "stopped by" in line or line.startswith("interrupted at")]
    if not stopped_lines:
        return "unclear", f"no line says where the run stopped: {out.strip()[-300:]!r}", cmd
    report = (run_dir / "report.md").read_text()
    if summary.get("status") == "interrupted" and "partial run" not in report:
        return "unclear", "report.md of an interrupted run is not marked partial", cmd
    if summary.get("status") not in ("interrupted", "complete"):
        return "wrong", f"summary.json's status is {summary.get('status')!r}", cmd
    return "ok", f"exit {rc}, status {summary.get('status')}: {stopped_lines[-1][:150]}", cmd



# ---- the labs' own files: labs/<lab>/faults.py --------------------------------------------------

def load_lab_files():
    """{lab: its faults.py as a module} for every registered lab that has one, in course order."""
    found = {}
    for lab in LABS:
        path = ROOT / "labs" / lab / "faults.py"
        if path.is_file():
            spec = importlib.util.spec_from_file_location(f"{lab}_faults", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            found[lab] = module
    return found


class Context:
    """What the makers of cases are given: where the binaries are, the folder cases write under,
    and the labs' faults.py files."""

    def __init__(self, bindir, out_root, lab_files):
        self.bindir, self.out_root, self.lab_files = bindir, out_root, lab_files

    def labs_with(self, setting):
        """[(lab, value)] of the labs whose faults.py states `setting` (and not as false), in course order."""
        return [(lab, getattr(module, setting)) for lab, module in self.lab_files.items()
                if getattr(module, setting, None)]


# ---- the cases every lab meets -----------------------------------------------------------------

def help_keys(binary):
    """(key, default, hint) of every config key the binary's --help lists."""
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60).stdout
    keys = []
    for line in out.splitlines():
        match = re.match(r"^  ([a-z_0-9]+(?:\.[a-z_0-9]+)+) = (.*?)\s{2,}(.*)$", line)
        if match:
            keys.append(match.groups())
    return keys


def mutations(key, default, hint):
    """Bad values of a key from its --help line: [(value, what)]."""
    found = re.search(r"\(([^()]*)\)\s*$", hint)
    rule = found.group(1) if found else ""
    bad = []
    if rule == "true|false":
        bad.append(("maybe", "not a bool"))
    elif re.match(r"an integer", rule):
        bad += [("abc", "not a number"), ("1.5", "not an integer")]
        low = re.search(r">= (-?\d+)", rule)
        if low:
            bad.append((str(int(low.group(1)) - 1), "below the range"))
    elif re.match(r"a number", rule):
        bad.append(("abc", "not a number"))
        if "> 0" in rule or ">= 0" in rule:
            bad.append(("-1", "below the range"))
        if "[0, 1]" in rule:
            bad.append(("1.5", "above the range"))
    elif "," in rule and not default.startswith("[") and all(" " not in c.strip() for c in rule.split(",")):
        bad.append(("bogus", "not one of the choices"))
    elif default.startswith("["):
        bad.append(("[", "not a list"))
        if rule.startswith("list of"):
            bad.append(("[bogus]", "a list element not among the choices"))
    return bad


def config_cases(ctx):
    """Every key of every lab's --help given values out of its type, range or choices; a misspelled key."""
    bindir, out_root = ctx.bindir, ctx.out_root
    cases = []
    for lab in LABS:
        binary = bindir / lab
        if not binary.exists():
            continue
        for key, default, hint in help_keys(str(binary)):
            for value, what in mutations(key, default, hint):
                def go(lab=lab, key=key, value=value):
                    out_dir = tempfile.mkdtemp(dir=out_root)
                    cmd = [str(bindir / lab), "--set", f"run.out_dir={out_dir}", "--set", f"{key}={value}"]
                    rc, out, _ = run(cmd, 60)
                    verdict = judge_error(rc, out, [key], " ".join(cmd))
                    if verdict[0] == "ok" and any(pathlib.Path(out_dir).iterdir()):
                        return "unclear", f"a run directory was left for a config error: {list(pathlib.Path(out_dir).rglob('*'))[:2]}", verdict[2]
                    return verdict
                cases.append(Case(f"config/{lab}/{key}={value} ({what})", "config", go))
        # a typo of a real key: the error suggests it
        def typo(lab=lab):
            cmd = [str(bindir / lab), "--set", "run.seeed=2"]
            return refused(cmd, ["did you mean 'run.seed'"])
        cases.append(Case(f"config/{lab}/misspelled key", "config", typo))
    return cases


def yaml_cases(ctx):
    """Config files that are not what a config file should be, given to every lab."""
    bindir, out_root = ctx.bindir, ctx.out_root
    bodies = {
        "duplicated key": ("run:\n  seed: 1\n  seed: 2\n", ["seed"]),
        "syntax error": ("run:\n  seed: [1, 2\n", [":3:"]),
        "a list, not a map": ("- 1\n- 2\n", []),
        "wrong type in the file": ("run:\n  seed: abc\n", ["run.seed"]),
        "unknown section": ("rnu:\n  seed: 1\n", ["rnu"]),
        "tab indentation": ("run:\n\tseed: 1\n", []),
        "two documents": ("run:\n  seed: 1\n---\nrun:\n  seed: 2\n", ["second YAML document"]),
    }
    cases = []
    for lab in LABS:
        if not (bindir / lab).exists():
            continue
        for what, (body, names) in bodies.items():
            def go(lab=lab, body=body, names=names):
                path = pathlib.Path(tempfile.mkdtemp(dir=out_root)) / "bad.yaml"
                path.write_text(body)
                cmd = [str(bindir / lab), "--config", str(path), "--set", f"run.out_dir={path.parent}/runs"]
                return refused(cmd, [str(path)] + names)
            cases.append(Case(f"yaml/{lab}/{what}", "yaml", go))

        def binary_file(lab=lab):
            path = pathlib.Path(tempfile.mkdtemp(dir=out_root)) / "bad.yaml"
            path.write_bytes(bytes(range(256)) * 4)
            cmd = [str(bindir / lab), "--config", str(path)]
            return refused(cmd, [str(path)])
        cases.append(Case(f"yaml/{lab}/binary file", "yaml", binary_file))

        def missing(lab=lab):
            cmd = [str(bindir / lab), "--config", "/nonexistent/amplab.yaml"]
            return refused(cmd, ["/nonexistent/amplab.yaml"])
        cases.append(Case(f"yaml/{lab}/missing file", "yaml", missing))
    return cases


def cli_cases(ctx):
    """Command lines every lab must refuse in one line."""
    bindir = ctx.bindir
    cases = []
    lines = {
        "unknown option": (["--frobnicate"], ["--frobnicate"]),
        "--set without a value": (["--set"], ["--set"]),
        "--set without '='": (["--set", "train.epochs"], ["train.epochs"]),
        "--set with an empty key": (["--set", "=3"], []),
        "--config is a directory": (["--config", "/tmp"], ["/tmp"]),
    }
    for lab in LABS:
        if not (bindir / lab).exists():
            continue
        for what, (args, names) in lines.items():
            def go(lab=lab, args=args, names=names):
                cmd = [str(bindir / lab)] + args
                return refused(cmd, names)
            cases.append(Case(f"cli/{lab}/{what}", "cli", go))
    return cases


def resume_option_cases(ctx):
    """--resume with nothing to resume, in the labs that save checkpoints (RESUMES in their faults.py)."""
    bindir, out_root = ctx.bindir, ctx.out_root
    cases = []
    for lab, _ in ctx.labs_with("RESUMES"):
        def resume_missing(lab=lab):
            out_dir = tempfile.mkdtemp(dir=out_root)
            cmd = [str(bindir / lab), "--set", "run.device=cpu", "--set", f"run.out_dir={out_dir}", "--resume", f"{out_dir}/nope.ckpt"]
            return refused(cmd, [f"{out_dir}/nope.ckpt"])
        cases.append(Case(f"cli/{lab}/--resume a missing file", "cli", resume_missing))

        def resume_latest_empty(lab=lab):
            out_dir = tempfile.mkdtemp(dir=out_root)
            cmd = [str(bindir / lab), "--set", "run.device=cpu", "--set", f"run.out_dir={out_dir}", "--resume", "latest"]
            return refused(cmd, ["latest"])
        cases.append(Case(f"cli/{lab}/--resume latest with no checkpoint", "cli", resume_latest_empty))
    return cases



def beyond_the_machine_cases(ctx):
    """Values each in its range that the machine or the libraries cannot honour (BEYOND_THE_MACHINE
    in a lab's faults.py): named, with the limit."""
    bindir, out_root = ctx.bindir, ctx.out_root
    cases = []
    for lab, beyond in ctx.labs_with("BEYOND_THE_MACHINE"):
        for assignment, names, what in beyond:
            def too_big(lab=lab, assignment=assignment, names=names):
                if not (bindir / lab).exists():
                    return "skipped", f"no {lab} binary", ""
                work = tempfile.mkdtemp(dir=out_root)
                return refused([str(bindir / lab), "--set", "run.device=cpu", "--set", f"run.out_dir={work}", "--set", assignment],
                               names, timeout=120)
            cases.append(Case(f"cli/{lab}/--set {what}", "cli", too_big, 130))
    return cases


def launcher_cases(ctx):
    """amplab-run, the launcher, when its reader goes away or it has no descriptors. Named cli/."""
    bindir = ctx.bindir
    cases = []

    def launcher_into_head():
        if not (bindir / "amplab-run").exists():
            return "skipped", "no amplab-run", ""
        script = (f"'{bindir}/amplab-run' --nproc-per-node 2 -- /bin/sh -c 'seq 1 20000' 2>&1 | head -1 >/dev/null; "
                  "exit ${PIPESTATUS[0]}")
        rc, out, _ = run(["/bin/bash", "-c", script], 60)
        if rc is None:
            return "hang", "", script
        if rc != 0:
            return "crash", f"amplab-run ended with {rc} (141: SIGPIPE) once head had its line", script
        return "ok", "exit 0: the launcher and its ranks outlived the reader", script
    cases.append(Case("cli/amplab-run/2>&1 | head -1", "cli", launcher_into_head))

    def launcher_closed_descriptors():
        if not (bindir / "amplab-run").exists():
            return "skipped", "no amplab-run", ""
        script = f"exec '{bindir}/amplab-run' --nproc-per-node 2 -- /bin/sh -c 'seq 1 5000' <&- >&- 2>&-"
        rc, out, _ = run(["/bin/bash", "-c", script], 60)
        if rc is None:
            return "hang", "", script
        return ("ok", "exit 0", script) if rc == 0 else ("crash", f"exit {rc} with its descriptors closed", script)
    cases.append(Case("cli/amplab-run/stdin, stdout, stderr closed", "cli", launcher_closed_descriptors))
    return cases


def stop_cases(ctx):
    """Ctrl-C (and SIGTERM) at a known moment in every lab whose faults.py says when (STOP): the run
    exits 128 + the signal, saying where it stopped, with its summary.json and report.md."""
    bindir, out_root = ctx.bindir, ctx.out_root
    cases = []
    for lab, stop in ctx.labs_with("STOP"):
        if not (bindir / lab).exists():
            continue
        for sig in (signal.SIGINT, signal.SIGTERM):
            def go(lab=lab, stop=stop, sig=sig):
                out_dir = tempfile.mkdtemp(dir=out_root)
                cmd = [str(bindir / lab), "--set", f"run.out_dir={out_dir}"] + stop["settings"]
                rc, out, sent = run_stopped_at(cmd, stop["after"], sig, 300)
                return stopped_well(rc, out, sent, sig, out_dir, lab, " ".join(cmd))
            cases.append(Case(f"stop/{lab}/{signal.Signals(sig).name} {stop['when']}", "stop", go, 330))
    return cases


def lab_cases(ctx):
    """Each lab's own cases: cases(ctx) of its faults.py, in course order."""
    cases = []
    for module in ctx.lab_files.values():
        if hasattr(module, "cases"):
            cases += module.cases(ctx)
    return cases


MAKERS = (config_cases, yaml_cases, cli_cases, resume_option_cases, beyond_the_machine_cases, launcher_cases,
          stop_cases, lab_cases)


# ---- running them, and the report --------------------------------------------------------------

def run_cases(cases, jobs):
    """Runs the cases, `jobs` at a time, printing each one that is not ok as it ends."""
    def one(case):
        started = time.monotonic()
        try:
            verdict, detail, command = case.run_fn()
        except Exception as e:  # a bug of the sweep itself, not of the binaries
            verdict, detail, command = "sweep error", f"{type(e).__name__}: {e}", ""
        return Result(case, verdict, detail, command, time.monotonic() - started)

    results = []
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for done, result in enumerate(pool.map(one, cases), start=1):
            results.append(result)
            if result.verdict != "ok":
                print(f"  [{done}/{len(cases)}] {result.verdict}: {result.case.name}: {result.detail[:200]}", flush=True)
            elif done % 25 == 0:
                print(f"  [{done}/{len(cases)}] ...", flush=True)
    return results


def report(results, seconds):
    """The tables (verdicts, categories) and a paragraph per failed case; the failed results."""
    count = lambda v: sum(r.verdict == v for r in results)  # noqa: E731
    print(f"\nsweep: {seconds:.0f} s")
    print("| cases tried | crashes | hangs | data lost | silent wrong | unclear messages | skipped | sweep errors |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    tried = len(results) - count("skipped")
    print(f"| {tried} | {count('crash')} | {count('hang')} | {count('lost')} | {count('wrong')} | {count('unclear')} | {count('skipped')} | {count('sweep error')} |")
    by_category = {}
    for r in results:
        by_category.setdefault(r.case.category, []).append(r)
    print("\n| category | cases | not ok |")
    print("| --- | --- | --- |")
    for category, rs in by_category.items():
        print(f"| {category} | {len(rs)} | {sum(r.verdict not in ('ok', 'skipped') for r in rs)} |")
    print("\nthe slowest cases: " + "; ".join(f"{r.case.name} {r.seconds:.0f} s"
                                             for r in sorted(results, key=lambda r: -r.seconds)[:8]))
    failed = [r for r in results if r.verdict not in ("ok", "skipped")]
    for r in failed:
        print(f"FAILED {r.verdict}: {r.case.name}\n  {r.detail}\n  command: {r.command}")
    return failed


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", default=str(ROOT / "build" / "bin"), help="the lab binaries (default: build/bin)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", default="", help="run only the cases whose name contains this (several: comma-separated)")
    parser.add_argument("--list", action="store_true", help="print the names of the cases (after --only) and exit")
    parser.add_argument("--out", help="write every case's result here (JSON)")
    args = parser.parse_args()
    bindir = pathlib.Path(args.bin).resolve()
    if not any((bindir / lab).exists() for lab in LABS):
        print(f"sweep: no lab binaries in {bindir} (build first, or pass --bin DIR)", file=sys.stderr)
        return 2
    out_root = tempfile.mkdtemp(prefix="amplab-sweep-")
    ctx = Context(bindir, out_root, load_lab_files())
    cases = [case for make in MAKERS for case in make(ctx)]
    wanted = [w for w in args.only.split(",") if w] or [""]
    cases = [c for c in cases if any(w in c.name for w in wanted)]
    if args.list:
        print("\n".join(c.name for c in cases))
        shutil.rmtree(out_root, ignore_errors=True)
        return 0
    print(f"sweep: {len(cases)} cases, {args.jobs} at a time, binaries in {bindir}", flush=True)
    started = time.monotonic()
    results = run_cases(cases, args.jobs)
    shutil.rmtree(out_root, ignore_errors=True)
    failed = report(results, time.monotonic() - started)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(
            [{"name": r.case.name, "category": r.case.category, "verdict": r.verdict, "detail": r.detail,
              "command": r.command} for r in results], indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
