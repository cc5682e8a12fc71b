"""The ddp lab's fault cases, which tests/faults/sweep.py loads (see its docstring): ranks on the
CPU that die, never join or start with different configs, through amplab-run and torchrun; a
bench too wide for memory.

Instructor-only: scripts/make-handout leaves labs/*/faults.py out of hand-outs.
"""
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import tempfile

from sweep import ROOT, Case, crashed, judge_error, refused, run  # tests/faults/sweep.py, which loads this file

RESUMES = True  # cli/ddp/--resume of a missing file, and of 'latest' with no checkpoint
# Ctrl-C and SIGTERM in a training step of one CPU process, as in every lab (stop_cases in sweep.py);
# the two-rank stops are the core process tests' (Interrupt.* through amplab-run and torchrun).
STOP = {"settings": ["--set", "run.device=cpu", "--set", "train.epochs=2", "--set", "data.train_limit=2048",
                     "--set", "data.test_limit=200"],
        "after": r"training on \d+ rank",
        "when": "in a training step"}
BEYOND_THE_MACHINE = [("dist.timeout_s=1e10", ["dist.timeout_s", "604800"], "dist.timeout_s beyond a week")]
# A CPU run of seconds that leaves a checkpoint: another lab's checkpoint, for the labs that refuse one.
QUICK_CHECKPOINT = ["--set", "run.device=cpu", "--set", "data.train_limit=512", "--set", "data.test_limit=200",
                    "--set", "train.epochs=1"]


def too_wide_cases(bindir, out_root):
    """The bench's sizes beyond memory."""
    if not (bindir / "ddp").exists():
        return []

    def ddp_too_wide():
        where = tempfile.mkdtemp(dir=out_root)
        return refused([str(bindir / "ddp"), "--set", "bench.enabled=true", "--set", "run.device=cpu",
                        "--set", "bench.width=1000000", "--set", f"run.out_dir={where}"], ["out of CPU memory", "bench.width"])
    return [Case("cli/ddp/bench.width beyond memory names the key", "cli", ddp_too_wide)]


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



def cases(ctx):
    """Every case of this file, in the order they run."""
    bindir, out_root = ctx.bindir, ctx.out_root
    return too_wide_cases(bindir, out_root) + dead_rank_cases(bindir, out_root) + rank_config_cases(bindir, out_root)
