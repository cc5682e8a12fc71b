#!/usr/bin/env python3
"""The fault sweep: bad input and faults thrown at the lab binaries as users would meet them.

    tests/faults/sweep.py                       every case, 2 at a time, binaries in build/bin
    tests/faults/sweep.py --only signal         the cases whose name contains 'signal'
    tests/faults/sweep.py --only cli/,yaml/     several (ctest fault_sweep_command_line runs these)
    tests/faults/sweep.py --bin DIR --jobs 4 --out sweep.json

Each case runs a binary (or two, or a launcher) with a timeout and is judged:
  crash    killed by a signal we did not send, exit 134/136/139, or 'terminate called',
           'Segmentation fault', 'core dumped' in its output;
  hang     still running at its timeout (the whole process group is then killed);
  lost     a resumed run ends elsewhere than the same run uninterrupted (metrics.csv's last
           epoch: train loss, test accuracy, test loss), or a checkpoint that should load does not;
  unclear  bad input accepted (exit 0), or refused with anything but one 'error:' line naming
           what was wrong (the key, the file, the rank);
  skipped  the machine cannot stage it (no tmpfs for the full disk): counted apart, not passed.
Prints a table (cases tried, crashes, hangs, data lost, unclear messages, skipped) and a line per
failed case; exit 1 when any case failed. Standard library only; CPU only.
"""
import argparse
import concurrent.futures
import csv
import gzip
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
LABS = ["gpu_basics", "amp_training", "memory_optimization", "mnist", "ddp", "cuda_kernels"]
CRASH_TEXT = re.compile(r"terminate called|Segmentation fault|core dumped|Aborted \(core|double free|stack smashing")
LOG_LINE = re.compile(r"^(\[rank \d+\] )?\[\d\d:\d\d:\d\d (trace|debug|info|warn|warning)\]")
ERROR_LINE = re.compile(r"^(\[rank \d+\] )?error: ")
TINY = ["--set", "mnist.modes=[cpu]", "--set", "mnist.cpu_epochs=3", "--set", "data.train_limit=1024",
        "--set", "data.test_limit=500", "--set", "mnist.plots=false", "--set", "run.deterministic=true",
        "--set", "train.log_every=1", "--set", "mnist.profile_steps=0", "--set", "run.device=cpu"]


class Case:
    def __init__(self, name, category, run, timeout=60):
        self.name, self.category, self.run_fn, self.timeout = name, category, run, timeout


class Result:
    def __init__(self, case, verdict, detail="", command=""):
        self.case, self.verdict, self.detail, self.command = case, verdict, detail, command


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


# ---- the cases ---------------------------------------------------------------------------------

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


def config_cases(bindir, out_root):
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


def yaml_cases(bindir, out_root):
    bodies = {
        "duplicated key": ("run:\n  seed: 1\n  seed: 2\n", ["seed"]),
        "syntax error": ("run:\n  seed: [1, 2\n", [":3:"]),
        "a list, not a map": ("- 1\n- 2\n", []),
        "wrong type in the file": ("run:\n  seed: abc\n", ["run.seed"]),
        "unknown section": ("rnu:\n  seed: 1\n", ["rnu"]),
        "tab indentation": ("run:\n\tseed: 1\n", []),
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


def cli_cases(bindir, out_root):
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
    for lab in ["amp_training", "mnist", "ddp"]:
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


def dataset_dir():
    for candidate in [os.environ.get("FASHION_MNIST_DIR", ""), str(ROOT / "data" / "fashion-mnist"),
                      "/usr/share/datasets/fashion-mnist"]:
        if candidate and (pathlib.Path(candidate) / "train-images-idx3-ubyte.gz").exists():
            return pathlib.Path(candidate)
    return None


def data_cases(bindir, out_root):
    source = dataset_dir()
    if source is None or not (bindir / "mnist").exists():
        return [Case("data/*", "data", lambda: ("skipped", "no Fashion-MNIST files here", ""))]
    files = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]

    def corrupt(name, how):
        def go():
            work = pathlib.Path(tempfile.mkdtemp(dir=out_root))
            for f in files:
                shutil.copy(source / f"{f}.gz", work / f"{f}.gz")
            target = work / f"{name}.gz"
            raw = gzip.decompress(target.read_bytes())
            if how == "truncated":
                raw = raw[: len(raw) // 2]
            elif how == "wrong magic":
                raw = b"\x00\x00\x09\x09" + raw[4:]
            elif how == "empty":
                raw = b""
            elif how == "27x29 images":
                raw = raw[:8] + (27).to_bytes(4, "big") + (29).to_bytes(4, "big") + raw[16:]
            elif how == "count too large":
                raw = raw[:4] + (10 ** 7).to_bytes(4, "big") + raw[8:]
            if how == "corrupt gzip":
                data = bytearray(target.read_bytes())
                for i in range(len(data) // 2, len(data) // 2 + 64):
                    data[i] ^= 0x5A
                target.write_bytes(bytes(data))
            elif how == "not gzip":
                target.write_bytes(b"this is not a gzip file\n" * 10)
            else:
                target.write_bytes(gzip.compress(raw, 1))
            cmd = [str(bindir / "mnist")] + TINY + ["--set", f"data.dir={work}", "--set", f"run.out_dir={work}/runs"]
            return refused(cmd, [name], timeout=120)
        return go

    cases = []
    for name in files:
        kinds = ["truncated", "wrong magic", "empty", "corrupt gzip", "not gzip", "count too large"]
        if "images" in name:
            kinds.append("27x29 images")
        for how in kinds:
            cases.append(Case(f"data/{name}/{how}", "data", corrupt(name, how), timeout=120))
    return cases


# ---- runs that train: checkpoints, signals, resume ---------------------------------------------

_baseline_lock = threading.Lock()
_baseline = {}


def last_epoch(out_dir):
    """(train_loss, test_accuracy, test_loss) of the last epoch row in the newest run's metrics.csv."""
    rows = []
    for metrics in sorted(pathlib.Path(out_dir).glob("mnist/2*/metrics.csv")):
        with open(metrics) as f:
            rows += [r for r in csv.DictReader(f) if r.get("tag") == "cpu"]
    if not rows:
        return None
    last = max(rows, key=lambda r: int(r["epoch"]))
    return last["epoch"], last["train_loss"], last["test_accuracy"], last["test_loss"]


def baseline(bindir, out_root):
    """The uninterrupted tiny run's last epoch, once."""
    with _baseline_lock:
        if "mnist" not in _baseline:
            out_dir = tempfile.mkdtemp(dir=out_root)
            rc, out, _ = run([str(bindir / "mnist")] + TINY + ["--set", f"run.out_dir={out_dir}"], 300)
            _baseline["mnist"] = (last_epoch(out_dir), out_dir) if rc == 0 else (None, out)
        return _baseline["mnist"]


def signal_cases(bindir, out_root):
    if not (bindir / "mnist").exists():
        return []
    cases = []

    def interrupted(sig, at, sig_name):
        def go():
            expected, where = baseline(bindir, out_root)
            if expected is None:
                return "crash", f"the uninterrupted run failed: {where[-300:]}", ""
            out_dir = tempfile.mkdtemp(dir=out_root)
            cmd = [str(bindir / "mnist")] + TINY + ["--set", f"run.out_dir={out_dir}"]
            rc, out, _ = run(cmd, 120, signals=[(at, sig, None)])
            if rc is None:
                return "hang", f"no exit after {sig_name} at {at} s", " ".join(cmd)
            crash = crashed(rc, out, sent=(sig,))
            if crash:
                return "crash", crash, " ".join(cmd)
            if sig != signal.SIGKILL and "checkpoint" not in out and last_epoch(out_dir) != expected:
                return "unclear", f"interrupted by {sig_name} without a word about a checkpoint: {out[-200:]!r}", " ".join(cmd)
            resume = cmd + ["--resume", "auto"]
            rc2, out2, _ = run(resume, 180)
            if rc2 is None:
                return "hang", "the resumed run did not end", " ".join(resume)
            crash = crashed(rc2, out2)
            if crash:
                return "crash", "resuming: " + crash, " ".join(resume)
            if rc2 != 0:
                return "lost", f"the resume failed (exit {rc2}): {out2.strip()[-300:]!r}", " ".join(resume)
            got = last_epoch(out_dir)
            if got != expected:
                return "lost", f"resumed run ends at {got}, uninterrupted at {expected}", " ".join(resume)
            return "ok", f"{sig_name} at {at} s, resumed to the same last epoch {got}", " ".join(resume)
        return go

    for at in [2.0, 3.0, 4.5, 6.0, 8.0]:
        cases.append(Case(f"signal/SIGINT at {at} s, then --resume auto", "signal", interrupted(signal.SIGINT, at, "SIGINT"), 330))
        cases.append(Case(f"signal/SIGTERM at {at} s, then --resume auto", "signal", interrupted(signal.SIGTERM, at, "SIGTERM"), 330))
    for at in [2.5, 3.5, 5.0, 6.5, 7.5, 9.0]:
        cases.append(Case(f"signal/SIGKILL at {at} s, then --resume auto", "signal", interrupted(signal.SIGKILL, at, "SIGKILL"), 330))

    def twice():
        out_dir = tempfile.mkdtemp(dir=out_root)
        cmd = [str(bindir / "mnist")] + TINY + ["--set", "mnist.cpu_epochs=30", "--set", f"run.out_dir={out_dir}"]
        rc, out, seconds = run(cmd, 60, signals=[(4.0, signal.SIGINT, None), (4.2, signal.SIGINT, None)])
        if rc is None:
            return "hang", "a second Ctrl-C did not end the run", " ".join(cmd)
        crash = crashed(rc, out, sent=(signal.SIGINT,))
        if crash:
            return "crash", crash, " ".join(cmd)
        return ("ok", f"exit {rc} after {seconds:.1f} s", " ".join(cmd)) if seconds < 15 else \
            ("hang", f"took {seconds:.1f} s after two Ctrl-C", " ".join(cmd))
    cases.append(Case("signal/two SIGINTs exit at once", "signal", twice, 90))
    return cases


def checkpoint_cases(bindir, out_root):
    if not (bindir / "mnist").exists():
        return []
    made = {}
    lock = threading.Lock()

    def good_checkpoint():
        with lock:
            if "path" not in made:
                out_dir = tempfile.mkdtemp(dir=out_root)
                run([str(bindir / "mnist")] + TINY + ["--set", "mnist.cpu_epochs=1", "--set", f"run.out_dir={out_dir}"], 300)
                found = sorted(pathlib.Path(out_dir).glob("mnist/checkpoints/*.ckpt"))
                made["path"] = found[-1] if found else None
            return made["path"]

    def corrupted(how):
        def go():
            good = good_checkpoint()
            if good is None:
                return "crash", "no checkpoint was made by the tiny run", ""
            work = pathlib.Path(tempfile.mkdtemp(dir=out_root))
            bad = work / "bad.ckpt"
            data = bytearray(good.read_bytes())
            if how == "truncated to half":
                data = data[: len(data) // 2]
            elif how == "truncated to 10 bytes":
                data = data[:10]
            elif how == "empty":
                data = bytearray()
            elif how.startswith("bytes flipped"):
                at = {"bytes flipped at the start": 64, "bytes flipped in the middle": len(data) // 2,
                      "bytes flipped at the end": len(data) - 200}[how]
                for i in range(at, at + 32):
                    data[i] ^= 0xFF
            elif how == "a text file":
                data = bytearray(b"not a checkpoint\n")
            elif how == "zeros":
                data = bytearray(len(data))
            bad.write_bytes(bytes(data))
            cmd = [str(bindir / "mnist")] + TINY + ["--set", f"run.out_dir={work}", "--resume", str(bad)]
            return refused(cmd, [str(bad)], timeout=120)
        return go

    cases = [Case(f"checkpoint/{how}", "checkpoint", corrupted(how), 300) for how in
             ["truncated to half", "truncated to 10 bytes", "empty", "bytes flipped at the start",
              "bytes flipped in the middle", "bytes flipped at the end", "a text file", "zeros"]]

    def latest(content, what):
        def go():
            good = good_checkpoint()
            if good is None:
                return "crash", "no checkpoint was made by the tiny run", ""
            work = pathlib.Path(tempfile.mkdtemp(dir=out_root))
            checkpoints = work / "mnist" / "checkpoints"
            checkpoints.mkdir(parents=True)
            (checkpoints / "latest").write_bytes(content)
            cmd = [str(bindir / "mnist")] + TINY + ["--set", f"run.out_dir={work}", "--resume", "latest"]
            return refused(cmd, ["latest"], timeout=120)
        return Case(f"checkpoint/'latest' {what}", "checkpoint", go, 300)
    cases += [latest(b"", "empty"), latest(bytes(range(256)), "binary"),
              latest(b"20990101-000000-cpu-step-00000001.ckpt\n", "naming a missing file"),
              latest(b"../../../etc/passwd\n", "pointing outside the directory")]

    def other_lab():
        work = pathlib.Path(tempfile.mkdtemp(dir=out_root))
        run([str(bindir / "ddp"), "--set", "run.device=cpu", "--set", "data.train_limit=512", "--set", "data.test_limit=200",
             "--set", "train.epochs=1", "--set", f"run.out_dir={work}"], 300)
        found = sorted(work.glob("ddp/checkpoints/*.ckpt"))
        if not found:
            return "skipped", "the ddp run made no checkpoint", ""
        cmd = [str(bindir / "mnist")] + TINY + ["--set", f"run.out_dir={work}", "--resume", str(found[-1])]
        return refused(cmd, [str(found[-1]), "ddp"], timeout=120)
    cases.append(Case("checkpoint/another lab's checkpoint", "checkpoint", other_lab, 300))
    return cases


def resume_cases(bindir, out_root):
    if not (bindir / "mnist").exists():
        return []

    def finished():
        out_dir = tempfile.mkdtemp(dir=out_root)
        cmd = [str(bindir / "mnist")] + TINY + ["--set", "mnist.cpu_epochs=1", "--set", f"run.out_dir={out_dir}"]
        run(cmd, 300)
        rc, out, _ = run(cmd + ["--resume", "latest"], 120)
        if rc is None:
            return "hang", "", " ".join(cmd)
        crash = crashed(rc, out)
        if crash:
            return "crash", crash, " ".join(cmd)
        if rc != 0 or "nothing left to train" not in out:
            return "unclear", f"exit {rc}, the output does not say the run is finished: {out.strip()[-200:]!r}", " ".join(cmd)
        return "ok", "says finished, exit 0", " ".join(cmd)

    def changed(key, value, names):
        def go():
            out_dir = tempfile.mkdtemp(dir=out_root)
            cmd = [str(bindir / "mnist")] + TINY + ["--set", f"run.out_dir={out_dir}"]
            run(cmd, 120, signals=[(4.5, signal.SIGINT, None)])
            resume = cmd + ["--set", f"{key}={value}", "--resume", "latest"]
            rc, out, _ = run(resume, 120)
            return judge_error(rc, out, names, " ".join(resume))
        return go

    def two_writers():
        out_dir = tempfile.mkdtemp(dir=out_root)
        cmd = [str(bindir / "mnist")] + TINY + ["--set", "mnist.cpu_epochs=20", "--set", f"run.out_dir={out_dir}"]
        first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            time.sleep(3)
            rc, out, _ = run(cmd, 60)
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
        return judge_error(rc, out, ["checkpoint"], " ".join(cmd))

    return [Case("resume/a finished run", "resume", finished, 300),
            Case("resume/train.batch_size changed", "resume", changed("train.batch_size", "256", ["train.batch_size", "--force"]), 300),
            Case("resume/train.accumulation_steps changed", "resume", changed("train.accumulation_steps", "2", ["train.accumulation_steps"]), 300),
            Case("resume/data.train_limit changed", "resume", changed("data.train_limit", "512", ["data.train_limit"]), 300),
            Case("resume/a second run writing the same checkpoint directory", "resume", two_writers, 120)]


def divergence_cases(bindir, out_root):
    if not (bindir / "mnist").exists():
        return []

    def diverge():
        out_dir = tempfile.mkdtemp(dir=out_root)
        cmd = [str(bindir / "mnist")] + TINY + ["--set", "train.optimizer.lr=1e6", "--set", "checkpoint.every_steps=1",
                                                "--set", f"run.out_dir={out_dir}"]
        rc, out, _ = run(cmd, 120)
        verdict = judge_error(rc, out, ["checkpoint"], " ".join(cmd))
        if verdict[0] != "ok":
            return verdict
        named = re.search(r"the last good checkpoint is '([^']+)'", out)
        if not named or not pathlib.Path(named.group(1)).exists():
            return "lost", "the message names no last good checkpoint that exists", " ".join(cmd)
        good_step = int(re.search(r"step-(\d+)", named.group(1)).group(1))
        kept = sorted(pathlib.Path(named.group(1)).parent.glob("*.ckpt"))
        later = [k.name for k in kept if int(re.search(r"step-(\d+)", k.name).group(1)) > good_step]
        if later:
            return "lost", f"checkpoints after the last good one were kept: {later}", " ".join(cmd)
        return "ok", f"{verdict[1][:120]}; kept: {[k.name[-15:] for k in kept]}", " ".join(cmd)
    return [Case("divergence/lr=1e6, a checkpoint every step", "divergence", diverge, 330)]


def disk_full_cases(bindir, out_root):
    if not (bindir / "mnist").exists():
        return []

    def full():
        mount = pathlib.Path(tempfile.mkdtemp(dir=out_root))
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True).returncode != 0:
            return "skipped", "cannot mount a tmpfs here (needs root)", ""
        try:
            cmd = [str(bindir / "mnist")] + TINY + ["--set", f"run.out_dir={mount}"]
            return refused(cmd, [str(mount)], timeout=180)
        finally:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)
    return [Case("disk/out_dir on a full 1 MB tmpfs", "disk", full, 240)]


def dead_rank_cases(bindir, out_root):
    if not (bindir / "ddp").exists() or not (bindir / "amplab-run").exists():
        return []
    torchrun = shutil.which("torchrun") or str(ROOT / ".venv" / "bin" / "torchrun")

    def launch(kind):
        def go():
            out_dir = tempfile.mkdtemp(dir=out_root)
            worker = [str(bindir / "ddp"), "--set", "run.device=cpu", "--set", "train.epochs=50", "--set", "data.train_limit=4096",
                      "--set", "data.test_limit=200", "--set", f"run.out_dir={out_dir}"]
            if kind == "amplab-run":
                cmd = [str(bindir / "amplab-run"), "--nproc-per-node", "2", "--"] + worker
            else:
                if not pathlib.Path(torchrun).exists():
                    return "skipped", "no torchrun", ""
                cmd = [torchrun, "--standalone", "--nproc-per-node", "2", "--no-python"] + worker
            rc, out, seconds = run(cmd, 90, signals=[(12.0, signal.SIGKILL, "1")])
            if rc is None:
                return "hang", "the survivors did not stop within 90 s", " ".join(cmd)
            if rc == 0:
                return "unclear", "exit 0 although rank 1 was killed", " ".join(cmd)
            ours = "\n".join(line for line in out.splitlines() if "Traceback" not in line)
            crash = crashed(rc, ours if kind == "torchrun" else out, sent=(signal.SIGKILL,))
            if crash and kind == "amplab-run":
                return "crash", crash, " ".join(cmd)
            named = [line for line in out.splitlines() if "rank 1" in line and ("error" in line or "died" in line or "stopped" in line)]
            if not named:
                return "unclear", f"no line names rank 1: {out.strip()[-400:]!r}", " ".join(cmd)
            return "ok", f"stopped after {seconds:.1f} s: {named[0][:160]}", " ".join(cmd)
        return go
    return [Case("dead rank/amplab-run, rank 1 killed", "dead rank", launch("amplab-run"), 120),
            Case("dead rank/torchrun --no-python, rank 1 killed", "dead rank", launch("torchrun"), 120)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", default=str(ROOT / "build" / "bin"), help="the lab binaries (default: build/bin)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", default="", help="run only the cases whose name contains this (several: comma-separated)")
    parser.add_argument("--out", help="write every case's result here (JSON)")
    args = parser.parse_args()
    bindir = pathlib.Path(args.bin).resolve()
    if not (bindir / "mnist").exists():
        print(f"sweep: no lab binaries in {bindir} (build first, or pass --bin DIR)", file=sys.stderr)
        return 2
    out_root = tempfile.mkdtemp(prefix="amplab-sweep-")
    cases = []
    for make in (config_cases, yaml_cases, cli_cases, data_cases, checkpoint_cases, signal_cases, resume_cases,
                 divergence_cases, disk_full_cases, dead_rank_cases):
        cases += make(bindir, out_root)
    wanted = [w for w in args.only.split(",") if w] or [""]
    cases = [c for c in cases if any(w in c.name for w in wanted)]
    print(f"sweep: {len(cases)} cases, {args.jobs} at a time, binaries in {bindir}", flush=True)
    results = []
    started = time.monotonic()

    def one(case):
        try:
            verdict, detail, command = case.run_fn()
        except Exception as e:  # a bug of the sweep itself, not of the binaries
            verdict, detail, command = "sweep error", f"{type(e).__name__}: {e}", ""
        return Result(case, verdict, detail, command)

    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for done, result in enumerate(pool.map(one, cases), start=1):
            results.append(result)
            if result.verdict != "ok":
                print(f"  [{done}/{len(cases)}] {result.verdict}: {result.case.name}: {result.detail[:200]}", flush=True)
            elif done % 25 == 0:
                print(f"  [{done}/{len(cases)}] ...", flush=True)
    shutil.rmtree(out_root, ignore_errors=True)

    count = lambda v: sum(r.verdict == v for r in results)  # noqa: E731
    print(f"\nsweep: {time.monotonic() - started:.0f} s")
    print("| cases tried | crashes | hangs | data lost | unclear messages | skipped | sweep errors |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    tried = len(results) - count("skipped")
    print(f"| {tried} | {count('crash')} | {count('hang')} | {count('lost')} | {count('unclear')} | {count('skipped')} | {count('sweep error')} |")
    by_category = {}
    for r in results:
        by_category.setdefault(r.case.category, []).append(r)
    print("\n| category | cases | not ok |")
    print("| --- | --- | --- |")
    for category, rs in by_category.items():
        print(f"| {category} | {len(rs)} | {sum(r.verdict not in ('ok', 'skipped') for r in rs)} |")
    failed = [r for r in results if r.verdict not in ("ok", "skipped")]
    for r in failed:
        print(f"FAILED {r.verdict}: {r.case.name}\n  {r.detail}\n  command: {r.command}")
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(
            [{"name": r.case.name, "category": r.case.category, "verdict": r.verdict, "detail": r.detail,
              "command": r.command} for r in results], indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
