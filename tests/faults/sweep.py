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
  wrong    silently something else than what was asked (a value cut short, a file in another
           place): exit 0 with the wrong result;
  skipped  the machine cannot stage it (no tmpfs for the full disk): counted apart, not passed.
Prints a table (cases tried, crashes, hangs, data lost, silent wrong, unclear messages, skipped) and a line per
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
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import amplab_labs  # noqa: E402

LABS = [lab.name for lab in amplab_labs.labs_or_exit()]  # labs/<lab>/lab.yaml, in course order
CRASH_TEXT = re.compile(r"terminate called|Segmentation fault|core dumped|Aborted \(core|double free|stack smashing")
LOG_LINE = re.compile(r"^(\[rank \d+\] )?\[\d\d:\d\d:\d\d (trace|debug|info|warn|warning)\]")
ERROR_LINE = re.compile(r"^(\[rank \d+\] )?error: ")
TINY = ["--set", "mnist.modes=[cpu]", "--set", "train.epochs=3", "--set", "data.train_limit=1024",
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


def special_file_cases(bindir, out_root):
    """FIFOs, devices, sparse files, dangling links and unreadable files where a file is expected:
    refused up front, saying what they are (a FIFO with no writer used to block forever, a device
    to be read until memory ran out). Named cli/ and yaml/: quick, and in CI."""
    if not (bindir / "mnist").exists():
        return []
    mnist = str(bindir / "mnist")

    def workdir():
        return pathlib.Path(tempfile.mkdtemp(dir=out_root))

    def config_fifo():
        work = workdir()
        os.mkfifo(work / "config.yaml")
        return refused([mnist, "--config", str(work / "config.yaml")], [str(work / "config.yaml"), "FIFO"], timeout=30)

    def resume_special(make, names_of):
        def go():
            work = workdir()
            target = make(work)
            cmd = [mnist] + TINY + ["--set", f"run.out_dir={work}", "--resume", target]
            return refused(cmd, names_of(target), timeout=60)
        return go

    def fifo(work):
        os.mkfifo(work / "ckpt")
        return str(work / "ckpt")

    def sparse(work):
        with open(work / "big.ckpt", "wb") as f:
            f.truncate(1 << 40)  # 1 TiB of zeros, no blocks on disk
        return str(work / "big.ckpt")

    def unreadable_config():
        work = workdir()
        work.chmod(0o755)
        (work / "c.yaml").write_text("run:\n  seed: 1\n")
        (work / "c.yaml").chmod(0)
        cmd = [mnist, "--config", str(work / "c.yaml")]
        if os.geteuid() == 0:  # root reads any file: run the binary as nobody instead
            if not shutil.which("setpriv"):
                return "skipped", "root reads any file, and setpriv is missing to run as another user", ""
            cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] + cmd
        return refused(cmd, [str(work / "c.yaml"), "Permission denied"])

    def dangling_latest():
        work = workdir()
        checkpoints = work / "mnist" / "checkpoints"
        checkpoints.mkdir(parents=True)
        (checkpoints / "latest").symlink_to("gone-step-00000001.ckpt")
        cmd = [mnist] + TINY + ["--set", f"run.out_dir={work}", "--resume", "latest"]
        return refused(cmd, ["latest", "dangling symbolic link"], timeout=60)

    return [Case("cli/mnist/--config names a FIFO with no writer", "cli", config_fifo, 40),
            Case("cli/mnist/--resume names a FIFO with no writer", "cli",
                 resume_special(fifo, lambda t: [t, "FIFO"]), 70),
            Case("cli/mnist/--resume /dev/zero", "cli",
                 resume_special(lambda w: "/dev/zero", lambda t: [t, "character device"]), 70),
            Case("cli/mnist/--resume /dev/urandom", "cli",
                 resume_special(lambda w: "/dev/urandom", lambda t: [t, "character device"]), 70),
            Case("cli/mnist/--resume a 1 TiB sparse file", "cli", resume_special(sparse, lambda t: [t]), 70),
            Case("cli/mnist/--config unreadable", "cli", unreadable_config),
            Case("cli/mnist/--resume latest, a dangling symbolic link", "cli", dangling_latest, 70)]


def surprise_cases(bindir, out_root):
    """Input that used to mean something else than what it says, silently: a '#' in a --set value,
    '~' in a path, an empty --resume, an explicit data directory passed over, numbers beyond their
    type, a launcher piped into head. Named cli/: quick, and in CI."""
    if not (bindir / "mnist").exists():
        return []
    mnist = str(bindir / "mnist")
    cases = []

    def set_refused(assignment, names):
        def go():
            work = tempfile.mkdtemp(dir=out_root)
            return refused([mnist, "--set", f"run.out_dir={work}", "--set", assignment], names)
        return go
    for assignment, names, what in [
            ("run.out_dir=~/amplab-runs", ["run.out_dir", "'~/amplab-runs' starts with '~'"], "'~' in run.out_dir"),
            ("checkpoint.dir=~/ckpts", ["checkpoint.dir", "'~/ckpts' starts with '~'"], "'~' in checkpoint.dir"),
            ("train.epochs=1000000000000", ["train.epochs", "larger than 2147483647"], "an int key beyond int"),
            ("train.batch_size=99999999999999999999", ["train.batch_size", "64-bit"], "an integer beyond int64"),
            ("mnist.modes=[cpu] # only the cpu", ["mnist.modes", "comment"], "a list with a comment")]:
        cases.append(Case(f"cli/mnist/--set {what}", "cli", set_refused(assignment, names)))

    # Values each in its range that the machine or the libraries cannot honour: named, with the limit.
    for lab, assignment, names, what in [
            ("ddp", "dist.timeout_s=1e10", ["dist.timeout_s", "604800"], "dist.timeout_s beyond a week"),
            ("amp_training", "amp.mlp.width=65536", ["amp.mlp.width", "bytes"], "the documented maximum width"),
            ("memory_optimization", "mem.model.width=65536", ["mem.model.width", "bytes"],
             "the documented maximum width")]:
        def too_big(lab=lab, assignment=assignment, names=names):
            if not (bindir / lab).exists():
                return "skipped", f"no {lab} binary", ""
            work = tempfile.mkdtemp(dir=out_root)
            return refused([str(bindir / lab), "--set", "run.device=cpu", "--set", f"run.out_dir={work}", "--set", assignment],
                           names, timeout=120)
        cases.append(Case(f"cli/{lab}/--set {what}", "cli", too_big, 130))

    def hash_in_value():
        work = pathlib.Path(tempfile.mkdtemp(dir=out_root))
        # data.dir that does not exist: the run stops right after making its run directory.
        cmd = [mnist, "--set", f"run.out_dir={work}/runs #2", "--set", f"data.dir={work}/nodata"]
        rc, out, _ = run(cmd, 60)
        if rc is None:
            return "hang", "", " ".join(cmd)
        if (work / "runs").exists():
            return "wrong", f"--set run.out_dir='{work}/runs #2' wrote to '{work}/runs'", " ".join(cmd)
        if not (work / "runs #2" / "mnist").exists():
            return "unclear", f"no run directory under 'runs #2' and no refusal of the value: {out.strip()[-200:]!r}", " ".join(cmd)
        return "ok", "the value kept whole: 'runs #2'", " ".join(cmd)
    cases.append(Case("cli/mnist/--set a value with ' #' in it", "cli", hash_in_value))

    def empty_resume():
        work = tempfile.mkdtemp(dir=out_root)
        return refused([mnist] + TINY + ["--set", f"run.out_dir={work}", "--resume", ""], ["--resume", "empty"])
    cases.append(Case("cli/mnist/--resume '' (an unset variable)", "cli", empty_resume))

    def explicit_data_dir(how):
        def go():
            work = pathlib.Path(tempfile.mkdtemp(dir=out_root))
            data = work / "data"
            data.mkdir()
            names = ["FASHION_MNIST_DIR"]
            if how == "a bad file":
                source = dataset_dir()
                if source is None:
                    return "skipped", "no Fashion-MNIST files here", ""
                for f in ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte"]:
                    shutil.copy(source / f"{f}.gz", data / f"{f}.gz")
                (data / "t10k-labels-idx1-ubyte.gz").write_bytes(b"not gzip\n")
                names = [str(data / "t10k-labels-idx1-ubyte.gz")]
            cmd = [mnist] + TINY + ["--set", f"run.out_dir={work}/runs"]
            rc, out, _ = run(cmd, 120, env=dict(os.environ, FASHION_MNIST_DIR=str(data)))
            return judge_error(rc, out, names, f"FASHION_MNIST_DIR={data} " + " ".join(cmd))
        return go
    cases.append(Case("cli/mnist/$FASHION_MNIST_DIR names an empty directory", "cli", explicit_data_dir("empty"), 130))
    cases.append(Case("cli/mnist/$FASHION_MNIST_DIR holds a bad file", "cli", explicit_data_dir("a bad file"), 130))

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

    def multi_member():  # what `cat a.gz b.gz` and pigz make: valid, and read whole
        work = pathlib.Path(tempfile.mkdtemp(dir=out_root))
        for f in files:
            shutil.copy(source / f"{f}.gz", work / f"{f}.gz")
        raw = gzip.decompress((work / "train-labels-idx1-ubyte.gz").read_bytes())
        half = len(raw) // 2
        (work / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(raw[:half]) + gzip.compress(raw[half:]))
        cmd = [str(bindir / "mnist")] + TINY + ["--set", "train.epochs=1", "--set", f"data.dir={work}",
                                                "--set", f"run.out_dir={work}/runs"]
        rc, out, _ = run(cmd, 300)
        if rc is None:
            return "hang", "", " ".join(cmd)
        crash = crashed(rc, out)
        if crash:
            return "crash", crash, " ".join(cmd)
        if rc != 0:
            return "unclear", f"a valid two-member gzip refused (exit {rc}): {out.strip()[-200:]!r}", " ".join(cmd)
        return "ok", "read whole and trained", " ".join(cmd)
    cases.append(Case("data/train-labels-idx1-ubyte/two gzip members (cat a.gz b.gz)", "data", multi_member, 330))
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
    for at in [3.0, 4.5, 6.0]:  # a closed terminal: saved as for SIGTERM
        cases.append(Case(f"signal/SIGHUP at {at} s, then --resume auto", "signal", interrupted(signal.SIGHUP, at, "SIGHUP"), 330))

    def twice():
        out_dir = tempfile.mkdtemp(dir=out_root)
        cmd = [str(bindir / "mnist")] + TINY + ["--set", "train.epochs=30", "--set", f"run.out_dir={out_dir}"]
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


def stop_cases(bindir, out_root):
    """Ctrl-C (and SIGTERM) in every lab that runs on the CPU, at a known moment: in a study, while
    the plots are drawn; then transformer_fp8 resumed row by row ends with the table of a run that
    was never stopped."""
    cases = []
    text = str(ROOT / "tests" / "fixtures" / "shakespeare_tiny.txt")
    studies = {  # lab: (extra arguments, the line after which the signal comes)
        "gpu_basics": ([], r"== Memory bandwidth"),
        "amp_training": ([], r"info\] cnn: "),
        "memory_optimization": ([], r"sweep: .*batch"),
        "transformer_fp8": (["--set", f"data.dir={text}", "--set", "study.attention_study=false"], r"bf16 step 50:"),
        "mnist": (["--set", "mnist.modes=[cpu]", "--set", "train.epochs=1", "--set", "data.train_limit=512",
                   "--set", "data.test_limit=200", "--set", "mnist.profile_steps=0", "--set", "run.device=cpu"],
                  r"== Modes"),  # the plots come next
    }
    for lab, (extra, pattern) in studies.items():
        if not (bindir / lab).exists():
            continue
        for sig in (signal.SIGINT, signal.SIGTERM):
            def go(lab=lab, extra=extra, pattern=pattern, sig=sig):
                out_dir = tempfile.mkdtemp(dir=out_root)
                cmd = [str(bindir / lab), "--set", f"run.out_dir={out_dir}"] + extra
                rc, out, sent = run_stopped_at(cmd, pattern, sig, 300)
                return stopped_well(rc, out, sent, sig, out_dir, lab, " ".join(cmd))
            when = "while the plots are drawn" if lab == "mnist" else "in a study"
            cases.append(Case(f"stop/{lab}/{signal.Signals(sig).name} {when}", "stop", go, 330))

    def resumed_row_by_row():
        binary = bindir / "transformer_fp8"
        base = [str(binary), "--set", f"data.dir={text}", "--set", "study.attention_study=false",
                "--set", "study.plots=false", "--set", "run.deterministic=true"]
        whole_dir, parts_dir = tempfile.mkdtemp(dir=out_root), tempfile.mkdtemp(dir=out_root)
        rc, out, _ = run(base + ["--set", f"run.out_dir={whole_dir}"], 300)
        if rc != 0:
            return "crash", f"the uninterrupted run failed: {out.strip()[-300:]!r}", " ".join(base)
        cmd = base + ["--set", f"run.out_dir={parts_dir}"]
        rc, out, sent = run_stopped_at(cmd, r"bf16 step 100:", signal.SIGINT, 300)
        verdict = stopped_well(rc, out, sent, signal.SIGINT, parts_dir, "transformer_fp8", " ".join(cmd))
        if verdict[0] != "ok":
            return verdict
        resume = cmd + ["--resume", "latest"]
        rc, out, _ = run(resume, 300)
        if rc != 0:
            return "lost", f"the resumed run failed (exit {rc}): {out.strip()[-300:]!r}", " ".join(resume)
        kept = "fp32: finished by the run in" in out
        whole, parts = newest_run(whole_dir, "transformer_fp8"), newest_run(parts_dir, "transformer_fp8")
        columns = lambda run_dir, name: [(r["row"], r["val_loss"]) for r in csv.DictReader(open(run_dir / name))]  # noqa: E731
        if not kept:
            return "lost", "the resumed run trained fp32 again instead of keeping it", " ".join(resume)
        for table in ("precision.csv", "losses.csv"):
            if columns(whole, table) != columns(parts, table):
                return "lost", f"{table}: {columns(parts, table)} after the resume, {columns(whole, table)} uninterrupted", \
                    " ".join(resume)
        if (whole / "sample.txt").read_text() != (parts / "sample.txt").read_text():
            return "lost", "sample.txt differs from the uninterrupted run's", " ".join(resume)
        return "ok", "Ctrl-C in the bf16 row, --resume latest: fp32 kept, the same val losses, curves and sample", " ".join(resume)
    if (bindir / "transformer_fp8").exists():
        cases.append(Case("stop/transformer_fp8/Ctrl-C in a row, then --resume latest: the uninterrupted table", "stop",
                          resumed_row_by_row, 600))
    return cases


def text_cases(bindir, out_root):
    """transformer_fp8's text: refused up front, by name, when it cannot train; any UTF-8 trains."""
    binary = bindir / "transformer_fp8"
    if not binary.exists():
        return []
    cases = []
    shakespeare = (ROOT / "tests" / "fixtures" / "shakespeare_tiny.txt").read_text()

    def staged(train, val=None):
        where = pathlib.Path(tempfile.mkdtemp(dir=out_root))
        if val is None:
            (where / "text.txt").write_bytes(train)
            return where / "text.txt"
        (where / "train.txt").write_bytes(train)
        (where / "val.txt").write_bytes(val)
        return where

    def bad(train, val, names, what):
        def go():
            data = staged(train, val)
            names_here = [n.replace("DATA", str(data)) for n in names]
            return refused([str(binary), "--set", f"data.dir={data}", "--set", f"run.out_dir={data}/runs"], names_here)
        cases.append(Case(f"text/{what}", "text", go))
    body = shakespeare.encode()
    bad(b"", None, ["DATA", "is empty"], "an empty file")
    bad(b"A", None, ["gpt.block_size", "DATA"], "one character")
    bad(body[:100], None, ["gpt.block_size", "DATA"], "100 characters")
    bad(os.urandom(1 << 20), None, ["DATA", "not UTF-8 text"], "1 MB of random bytes")
    bad(body, b"", ["DATA/val.txt", "is empty"], "an empty val.txt")
    bad(body, body[:30], ["DATA/val.txt", "gpt.block_size"], "a val.txt shorter than one context")

    def non_ascii():
        text = shakespeare.replace("e", "é").replace("o", "ø").replace("a", "аα")  # 2-byte characters everywhere
        data = staged(text.encode())
        cmd = [str(binary), "--set", f"data.dir={data}", "--set", f"run.out_dir={data.parent}/runs",
               "--set", "study.rows=[fp32]", "--set", "study.attention_study=false", "--set", "study.steps=20",
               "--set", "study.eval_every=10", "--set", "study.plots=false"]
        rc, out, _ = run(cmd, 300)
        if rc != 0:
            return "crash" if crashed(rc, out) else "lost", f"exit {rc}: {out.strip()[-300:]!r}", " ".join(cmd)
        run_dir = newest_run(data.parent / "runs", "transformer_fp8")
        sample = (run_dir / "sample.txt").read_bytes().decode("utf-8")  # raises on a character cut in two
        summary = json.loads((run_dir / "summary.json").read_text())
        if summary["sample"]["text"] + "\n" != sample or not set(sample) & set("éøаα"):
            return "wrong", f"the sample is not the model's UTF-8 text: {sample[:80]!r}", " ".join(cmd)
        return "ok", f"trained on UTF-8 with 2-byte characters; sample {sample[:40]!r}", " ".join(cmd)
    cases.append(Case("text/UTF-8 with non-ASCII characters trains and writes its sample", "text", non_ascii, 330))
    return cases


def rank_config_cases(bindir, out_root):
    """Ranks started with different configs are refused at start, naming the key and the ranks."""
    binary = bindir / "ddp"
    if not binary.exists():
        return []

    def different_batch():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        out_dir = tempfile.mkdtemp(dir=out_root)
        procs = []
        for rank in (0, 1):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank),
                       LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2")
            cmd = [str(binary), "--set", "bench.enabled=true", "--set", "run.device=cpu", "--set", f"run.out_dir={out_dir}",
                   "--set", f"bench.batch={64 if rank == 0 else 32}"]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        results = []
        for proc in procs:
            try:
                out, _ = proc.communicate(timeout=90)
                results.append((proc.returncode, out))
            except subprocess.TimeoutExpired:
                proc.kill()
                return "hang", "ranks with different configs did not stop", "ddp on 2 ranks, bench.batch 64 and 32"
        for rank, (rc, out) in enumerate(results):
            verdict = judge_error(rc, out, ["bench.batch", "rank 0", "rank 1"], f"rank {rank}")
            if verdict[0] != "ok":
                return verdict
        return "ok", results[0][1].strip()[-200:], "ddp on 2 ranks, bench.batch 64 and 32"
    return [Case("ranks/rank 1 started with another bench.batch", "ranks", different_batch, 120)]


def out_dir_cases(bindir, out_root):
    """run.out_dir that is not what it seems; the DDP lab's sizes beyond memory."""
    if not (bindir / "gpu_basics").exists() or not (bindir / "ddp").exists():
        return []

    def ddp_too_wide():
        where = tempfile.mkdtemp(dir=out_root)
        return refused([str(bindir / "ddp"), "--set", "bench.enabled=true", "--set", "run.device=cpu",
                        "--set", "bench.width=1000000", "--set", f"run.out_dir={where}"], ["out of CPU memory", "bench.width"])

    def dangling():
        where = pathlib.Path(tempfile.mkdtemp(dir=out_root))
        (where / "runs").symlink_to(where / "gone")
        return refused([str(bindir / "gpu_basics"), "--set", f"run.out_dir={where / 'runs'}"],
                       ["run.out_dir", "symbolic link", "does not exist"])
    return [Case("cli/gpu_basics/run.out_dir a dangling symbolic link", "cli", dangling),
            Case("cli/ddp/bench.width beyond memory names the key", "cli", ddp_too_wide)]


def plot_cases(bindir, out_root):
    """What can go wrong once the work is done: a venv this user cannot look into."""
    if not (bindir / "gpu_basics").exists():
        return []

    def venv_unreadable():
        venv = ROOT / ".venv" / "bin"  # its lib/ (libtorch, which the binaries load) stays readable
        if os.geteuid() != 0 or not venv.is_dir() or shutil.which("setpriv") is None:
            return "skipped", "needs root, setpriv and the .venv to run as another user who cannot read it", ""
        out_dir = tempfile.mkdtemp(prefix="amplab-sweep-other-user-")  # the sweep's own is root's alone
        os.chmod(out_dir, 0o777)
        mode = venv.stat().st_mode & 0o7777
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(bindir / "gpu_basics"),
               "--set", f"run.out_dir={out_dir}", "--set", "bench.matmul_sizes=[64]", "--set", "bench.copy_mib=1"]
        try:
            os.chmod(venv, 0o700)  # root's own: the other user cannot even stat .venv/bin/python
            rc, out, _ = run(cmd, 120)
        finally:
            os.chmod(venv, mode)
        run_dir = newest_run(out_dir, "gpu_basics")
        kept = run_dir is not None and (run_dir / "report.md").exists()
        shutil.rmtree(out_dir, ignore_errors=True)
        if rc != 0 or not kept:
            return "lost", f"exit {rc}, report.md missing: {out.strip()[-300:]!r}", " ".join(cmd)
        said = [line for line in out.splitlines() if "plots skipped" in line] or [""]
        return "ok", "finished with its report; " + said[0][:160], " ".join(cmd)
    return [Case("plots/a .venv the user cannot read: the run keeps its report", "plots", venv_unreadable, 150)]


def resumed_like_baseline(bindir, out_root, out_dir, cmd, what):
    """--resume auto after `what`; the verdict of comparing its last epoch with the uninterrupted run's."""
    expected, where = baseline(bindir, out_root)
    if expected is None:
        return "crash", f"the uninterrupted run failed: {where[-300:]}", ""
    resume = cmd + ["--resume", "auto"]
    rc, out, _ = run(resume, 180)
    if rc is None:
        return "hang", "the resumed run did not end", " ".join(resume)
    crash = crashed(rc, out)
    if crash:
        return "crash", "resuming: " + crash, " ".join(resume)
    got = last_epoch(out_dir)
    if rc != 0 or got != expected:
        return "lost", f"{what}; resumed (exit {rc}) to {got}, uninterrupted {expected}: {out.strip()[-200:]!r}", " ".join(resume)
    return "ok", f"{what}; resumed to the same last epoch {got}", " ".join(resume)


def profile_cases(bindir, out_root):
    """The per-phase profile states the sample it took (a CPU profile takes 3 steps, whatever
    mnist.profile_steps asks)."""
    if not (bindir / "mnist").exists():
        return []

    def sample_size():
        out_dir = tempfile.mkdtemp(dir=out_root)
        cmd = [str(bindir / "mnist")] + TINY + ["--set", "train.epochs=1", "--set", "mnist.profile_steps=30",
                                                "--set", f"run.out_dir={out_dir}"]
        rc, out, _ = run(cmd, 300)
        if rc != 0:
            return ("hang" if rc is None else "crash" if crashed(rc, out) else "unclear"), f"exit {rc}", " ".join(cmd)
        heading = next((line for line in out.splitlines() if line.lstrip("= ").startswith("Where a step's time goes")), "")
        if "30 steps" in out or "cpu 3;" not in heading:
            return "wrong", f"the profile's sample as stated: {heading[:160]!r}", " ".join(cmd)
        return "ok", heading[:120], " ".join(cmd)
    return [Case("profile/mnist.profile_steps=30 on the CPU: the sample stated is the one taken", "profile", sample_size, 330)]


def saved_in_log(out_dir):
    """Whether the run's log file says an interrupt saved a checkpoint (its console may be gone)."""
    return any("checkpoint saved to" in log.read_text(errors="replace")
               for log in pathlib.Path(out_dir).glob("mnist/2*/mnist.log"))


def terminal_cases(bindir, out_root):
    """The terminal goes away: a pipe whose reader died (| tee killed by the same Ctrl-C, | head),
    closed descriptors, a file-size limit. Every case ends in a checkpoint that resumes to the
    uninterrupted run, or in one error line."""
    if not (bindir / "mnist").exists():
        return []

    def shell(cmd, tail):
        return " ".join(f"'{a}'" for a in cmd) + tail

    def under_tee():
        out_dir = tempfile.mkdtemp(dir=out_root)
        cmd = [str(bindir / "mnist")] + TINY + ["--set", f"run.out_dir={out_dir}"]
        # Ctrl-C reaches the whole pipeline: tee dies at once, the run's next console line meets no
        # reader. (bash traps SIGINT to report the run's own exit; the run gets SIGINT's default.)
        script = "trap : INT; " + shell(cmd, f" 2>&1 | tee '{out_dir}/console.log' >/dev/null; exit ${{PIPESTATUS[0]}}")
        rc, out, _ = run(["/bin/bash", "-c", script], 120, signals=[(4.5, signal.SIGINT, None)])
        if rc is None:
            return "hang", "no exit after Ctrl-C under | tee", script
        if rc == 141 or crashed(rc, out, sent=(signal.SIGINT,)):
            return "crash", f"exit {rc} (141: SIGPIPE) under | tee", script
        if rc == 130 and not saved_in_log(out_dir):
            return "lost", "exit 130 under | tee without an interrupt checkpoint", script
        return resumed_like_baseline(bindir, out_root, out_dir, cmd, f"Ctrl-C under | tee: exit {rc}")

    def into_head():
        out_dir = tempfile.mkdtemp(dir=out_root)
        cmd = [str(bindir / "mnist")] + TINY + ["--set", f"run.out_dir={out_dir}"]
        script = shell(cmd, " 2>&1 | head -1 >/dev/null; exit ${PIPESTATUS[0]}")
        rc, out, _ = run(["/bin/bash", "-c", script], 300)
        expected, _ = baseline(bindir, out_root)
        if rc is None:
            return "hang", "", script
        if rc != 0:
            return "crash", f"exit {rc} (141: SIGPIPE) once head had its line", script
        got = last_epoch(out_dir)
        return ("ok", f"ran to the end: {got}", script) if got == expected else \
            ("lost", f"ended at {got}, uninterrupted {expected}", script)

    def closed_descriptors():
        out_dir = tempfile.mkdtemp(dir=out_root)
        cmd = [str(bindir / "mnist")] + TINY + ["--set", f"run.out_dir={out_dir}"]
        script = "exec " + shell(cmd, " <&- >&- 2>&-")
        rc, out, _ = run(["/bin/bash", "-c", script], 120, signals=[(4.5, signal.SIGTERM, None)])
        if rc is None:
            return "hang", "", script
        lock = pathlib.Path(out_dir) / "mnist" / "checkpoints" / ".lock"
        text = lock.read_text(errors="replace") if lock.exists() else ""
        if text.count("\n") > 1:
            return "wrong", f"console output landed in the lock file: {text[:200]!r}", script
        if rc == 143 and not saved_in_log(out_dir):
            return "lost", "exit 143 without an interrupt checkpoint", script
        return resumed_like_baseline(bindir, out_root, out_dir, cmd, f"SIGTERM with <&- >&- 2>&-: exit {rc}")

    def file_size_limit():
        out_dir = tempfile.mkdtemp(dir=out_root)
        cmd = [str(bindir / "mnist")] + TINY + ["--set", f"run.out_dir={out_dir}"]
        script = "ulimit -f 64; exec " + shell(cmd, "")  # 64 KiB per file; SIGXFSZ left at its default
        rc, out, _ = run(["/bin/bash", "-c", script], 120)
        if rc == 128 + signal.SIGXFSZ or rc == -signal.SIGXFSZ:
            return "crash", "killed by SIGXFSZ", script
        return judge_error(rc, out, ["File too large"], script)

    return [Case("terminal/Ctrl-C under 2>&1 | tee, then --resume auto", "terminal", under_tee, 330),
            Case("terminal/2>&1 | head -1: runs to the end", "terminal", into_head, 330),
            Case("terminal/stdin, stdout, stderr closed, SIGTERM, then --resume auto", "terminal", closed_descriptors, 330),
            Case("terminal/ulimit -f 64 (a file-size limit)", "terminal", file_size_limit, 150)]


def clock_cases(bindir, out_root):
    """Two runs with their own run.out_dir sharing checkpoint.dir, started at the same clock second
    (faketime): each keeps its checkpoint."""
    faketime = shutil.which("faketime")
    if not (bindir / "mnist").exists():
        return []

    def same_second():
        if faketime is None:
            return "skipped", "no faketime (apt-get install faketime)", ""
        work = pathlib.Path(tempfile.mkdtemp(dir=out_root))
        shared = work / "shared-checkpoints"
        names = []
        # The wall clock stands still at one second (-f, an absolute time); the monotonic clock,
        # which the run times itself with, goes on.
        env = dict(os.environ, FAKETIME_DONT_FAKE_MONOTONIC="1")
        for n in (1, 2):
            cmd = [faketime, "-f", "2026-03-01 12:00:00", str(bindir / "mnist")] + TINY + [
                "--set", "train.epochs=1", "--set", f"run.out_dir={work}/out{n}", "--set", f"checkpoint.dir={shared}"]
            rc, out, _ = run(cmd, 300, env=env)
            if rc != 0:
                return "crash" if crashed(rc, out) else "unclear", f"run {n}: exit {rc}: {out.strip()[-200:]!r}", " ".join(cmd)
            names.append(sorted(p.name for p in (work / f"out{n}" / "mnist").iterdir()))
        kept = sorted(p.name for p in shared.glob("*.ckpt"))
        if names[0] != names[1]:
            return "skipped", f"faketime did not repeat the second here: {names}", ""
        if len(kept) != 2:
            return "lost", f"two runs in the same second, {len(kept)} checkpoint(s) kept: {kept}", " ".join(cmd)
        return "ok", f"both kept: {kept}", " ".join(cmd)
    return [Case("clock/two runs in the same second share checkpoint.dir (faketime)", "clock", same_second, 660)]


def checkpoint_cases(bindir, out_root):
    if not (bindir / "mnist").exists():
        return []
    made = {}
    lock = threading.Lock()

    def good_checkpoint():
        with lock:
            if "path" not in made:
                out_dir = tempfile.mkdtemp(dir=out_root)
                run([str(bindir / "mnist")] + TINY + ["--set", "train.epochs=1", "--set", f"run.out_dir={out_dir}"], 300)
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
    def run_latest(content, what):
        # The run's own pointer, beside its run directories (<run.out_dir>/mnist/latest).
        def go():
            work = pathlib.Path(tempfile.mkdtemp(dir=out_root))
            (work / "mnist").mkdir(parents=True)
            (work / "mnist" / "latest").write_bytes(content)
            cmd = [str(bindir / "mnist")] + TINY + ["--set", f"run.out_dir={work}", "--resume", "latest"]
            return refused(cmd, [str(work / "mnist" / "latest")], timeout=120)
        return Case(f"checkpoint/the run's 'latest' {what}", "checkpoint", go, 300)
    cases += [run_latest(bytes(range(256)), "binary"), run_latest(b"checkpoints/gone-step-00000001.ckpt\n", "naming a missing file")]
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
        cmd = [str(bindir / "mnist")] + TINY + ["--set", "train.epochs=1", "--set", f"run.out_dir={out_dir}"]
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
        cmd = [str(bindir / "mnist")] + TINY + ["--set", "train.epochs=20", "--set", f"run.out_dir={out_dir}"]
        first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            time.sleep(3)
            rc, out, _ = run(cmd, 60)
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
        return judge_error(rc, out, ["checkpoint"], " ".join(cmd))

    def latest_per_out_dir():
        # Two runs of different run.out_dir sharing checkpoint.dir: the second (2 epochs) writes the
        # shared directory last, yet `--resume latest` of the first goes on from the first's checkpoint.
        work = pathlib.Path(tempfile.mkdtemp(dir=out_root))
        shared = ["--set", f"checkpoint.dir={work}/shared-checkpoints"]
        cmds = {n: [str(bindir / "mnist")] + TINY + shared + ["--set", f"train.epochs={n}", "--set", f"run.out_dir={work}/out{n}"]
                for n in (1, 2)}
        for n in (1, 2):
            rc, out, _ = run(cmds[n], 300)
            if rc != 0:
                return "crash" if crashed(rc, out) else "unclear", f"run {n}: exit {rc}: {out.strip()[-200:]!r}", " ".join(cmds[n])
        resume = cmds[1] + ["--resume", "latest"]
        rc, out, _ = run(resume, 120)
        crash = crashed(rc, out)
        if rc is None or crash:
            return ("hang", "", " ".join(resume)) if rc is None else ("crash", crash, " ".join(resume))
        first_runs = [p.name for p in (work / "out1" / "mnist").glob("2*")]
        named = re.search(r"checkpoint '([^']+)' is at the end of its run", out)
        if rc != 0 or not named:
            return "wrong", f"exit {rc}, not the first run's finished checkpoint: {out.strip()[-200:]!r}", " ".join(resume)
        if not any(pathlib.Path(named.group(1)).name.startswith(name + "-") for name in first_runs):
            return "wrong", f"resumed {named.group(1)}, not a checkpoint of {first_runs}", " ".join(resume)
        return "ok", f"resumed its own {pathlib.Path(named.group(1)).name}", " ".join(resume)

    return [Case("resume/a finished run", "resume", finished, 300),
            Case("resume/latest of one out_dir while another shares checkpoint.dir", "resume", latest_per_out_dir, 600),
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
    def nan_beyond_patience():
        out_dir = tempfile.mkdtemp(dir=out_root)
        cmd = [str(bindir / "mnist")] + TINY + ["--set", "train.optimizer.lr=1e6", "--set", "train.divergence_patience=100000",
                                                "--set", f"run.out_dir={out_dir}"]
        rc, out, _ = run(cmd, 300)
        if rc == 0:
            return "wrong", "a run whose loss was NaN for whole epochs reported success", " ".join(cmd)
        return judge_error(rc, out, ["not finite", "train.divergence_patience"], " ".join(cmd))
    return [Case("divergence/lr=1e6, a checkpoint every step", "divergence", diverge, 330),
            Case("divergence/NaN for whole epochs, train.divergence_patience beyond the run", "divergence",
                 nan_beyond_patience, 330)]


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
            polls = out.count("likely a timeout")
            if polls and kind == "amplab-run":
                return "unclear", f"{polls} lines of c10d's waitForInput warnings around the error", " ".join(cmd)
            return "ok", f"stopped after {seconds:.1f} s: {named[0][:160]}", " ".join(cmd)
        return go
    def exits_at_once():
        out_dir = tempfile.mkdtemp(dir=out_root)
        worker = (f"if [ $RANK = 1 ]; then exit 0; fi; exec '{bindir}/ddp' --set run.device=cpu --set dist.timeout_s=20 "
                  f"--set data.train_limit=512 --set data.test_limit=100 --set train.epochs=1 --set run.out_dir={out_dir}")
        cmd = [str(bindir / "amplab-run"), "--nproc-per-node", "2", "--", "/bin/bash", "-c", worker]
        rc, out, _ = run(cmd, 90)
        if rc is None:
            return "hang", "", " ".join(cmd)
        if rc == 0:
            return "unclear", "exit 0 although rank 1 never joined", " ".join(cmd)
        polls = out.count("likely a timeout")
        if polls:
            return "unclear", f"{polls} lines of c10d's waitForInput warnings", " ".join(cmd)
        if not re.search(r"rank 1 \(pid \d+\) exited with code 0 after", out):
            return "unclear", f"no launcher line names rank 1's exit: {out.strip()[-300:]!r}", " ".join(cmd)
        errors = [line for line in out.splitlines() if "error:" in line]
        if len(errors) != 1 or "rank 1" not in errors[0]:
            return "unclear", f"not one error line naming rank 1: {errors}", " ".join(cmd)
        return "ok", errors[0][:160], " ".join(cmd)

    def half_a_job():  # --nnodes 2 with only node 0 started: rank 0 must end in one line naming rank 1
        out_dir = tempfile.mkdtemp(dir=out_root)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        cmd = [str(bindir / "amplab-run"), "--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1",
               "--master-port", str(port), "--nproc-per-node", "1", "--", str(bindir / "ddp"), "--set", "run.device=cpu",
               "--set", "dist.timeout_s=15", "--set", "data.train_limit=512", "--set", f"run.out_dir={out_dir}"]
        rc, out, _ = run(cmd, 90)
        if rc is None:
            return "hang", "", " ".join(cmd)
        polls = out.count("likely a timeout")
        if polls:
            return "unclear", f"{polls} lines of c10d's waitForInput warnings", " ".join(cmd)
        errors = [line for line in out.splitlines() if "error:" in line]
        if rc == 0 or len(errors) != 1 or "rank 1" not in errors[0]:
            return "unclear", f"exit {rc}, error lines {errors}", " ".join(cmd)
        return "ok", errors[0][:160], " ".join(cmd)

    return [Case("dead rank/amplab-run, rank 1 exits 0 at once", "dead rank", exits_at_once, 120),
            Case("dead rank/amplab-run --nnodes 2, node 1 never started", "dead rank", half_a_job, 120),
            Case("dead rank/amplab-run, rank 1 killed", "dead rank", launch("amplab-run"), 120),
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
    for make in (config_cases, yaml_cases, cli_cases, special_file_cases, surprise_cases, data_cases, checkpoint_cases,
                 signal_cases, terminal_cases, clock_cases, profile_cases, resume_cases, divergence_cases, disk_full_cases,
                 dead_rank_cases, stop_cases, text_cases, rank_config_cases, out_dir_cases, plot_cases):
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
