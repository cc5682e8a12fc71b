"""The MNIST lab's fault cases, which tests/faults/sweep.py loads (see its docstring): the cases
that drive bin/mnist, the lab whose tiny CPU run trains in seconds. Special files where a file is
expected, values that used to mean something else, Fashion-MNIST files corrupted, checkpoints
corrupted, signals then resume, the terminal going away, two runs in the same second, the
profile's sample, resume with other settings, divergence, a full disk.

Instructor-only: scripts/make-handout leaves labs/*/faults.py out of hand-outs.
"""
import csv
import gzip
import os
import pathlib
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time

from sweep import ROOT, Case, crashed, judge_error, refused, run  # tests/faults/sweep.py, which loads this file

RESUMES = True  # cli/mnist/--resume of a missing file, and of 'latest' with no checkpoint
STOP = {"settings": ["--set", "mnist.modes=[cpu]", "--set", "train.epochs=1", "--set", "data.train_limit=512",
                     "--set", "data.test_limit=200", "--set", "mnist.profile_steps=0", "--set", "run.device=cpu"],
        "after": r"== Modes",  # the plots come next
        "when": "while the plots are drawn"}
# The tiny deterministic CPU run most cases here start from: 3 epochs of 1024 images, in seconds.
TINY = ["--set", "mnist.modes=[cpu]", "--set", "train.epochs=3", "--set", "data.train_limit=1024",
        "--set", "data.test_limit=500", "--set", "mnist.plots=false", "--set", "run.deterministic=true",
        "--set", "train.log_every=1", "--set", "mnist.profile_steps=0", "--set", "run.device=cpu"]


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
    type. Named cli/: quick, and in CI."""
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


def checkpoint_cases(bindir, out_root, donors):
    """Checkpoints and 'latest' pointers damaged, and another lab's checkpoint: the first of `donors`
    ([(lab, QUICK_CHECKPOINT)], the labs whose quick run leaves one)."""
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
        if not donors:
            return "skipped", "no other lab's faults.py states QUICK_CHECKPOINT", ""
        donor, quick = donors[0]
        work = pathlib.Path(tempfile.mkdtemp(dir=out_root))
        run([str(bindir / donor)] + quick + ["--set", f"run.out_dir={work}"], 300)
        found = sorted(work.glob(f"{donor}/checkpoints/*.ckpt"))
        if not found:
            return "skipped", f"the {donor} run made no checkpoint", ""
        cmd = [str(bindir / "mnist")] + TINY + ["--set", f"run.out_dir={work}", "--resume", str(found[-1])]
        return refused(cmd, [str(found[-1]), donor], timeout=120)
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



def cases(ctx):
    """Every case of this file, in the order they run."""
    bindir, out_root = ctx.bindir, ctx.out_root
    donors = [(lab, settings) for lab, settings in ctx.labs_with("QUICK_CHECKPOINT") if lab != "mnist"]
    return (special_file_cases(bindir, out_root) + surprise_cases(bindir, out_root) + data_cases(bindir, out_root)
            + checkpoint_cases(bindir, out_root, donors) + signal_cases(bindir, out_root)
            + terminal_cases(bindir, out_root) + clock_cases(bindir, out_root) + profile_cases(bindir, out_root)
            + resume_cases(bindir, out_root) + divergence_cases(bindir, out_root) + disk_full_cases(bindir, out_root))
