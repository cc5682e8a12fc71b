"""The sharded_training lab's fault cases, which tests/faults/sweep.py loads (see its docstring):
Ctrl-C and SIGTERM in a training step, alone and on two CPU ranks, where every rank must stop
after the same step (a rank that stopped alone would leave the other waiting in a collective);
a GPU memory cap asked of the CPU.

Instructor-only: scripts/make-handout leaves labs/*/faults.py out of hand-outs.
"""
import signal
import tempfile

from sweep import Case, run_stopped_at, stopped_well  # tests/faults/sweep.py, which loads this file

LONG_RUN = ["--set", "run.device=cpu", "--set", "model.width=64", "--set", "train.steps=1000000"]
STOP = {"settings": LONG_RUN, "after": r"MLP \d+ x Linear\(\d+\), \d+ parameters", "when": "in a training step"}
# A memory cap, or the CUDA allocator's expandable segments, where there is no GPU: refused,
# naming the key.
BEYOND_THE_MACHINE = [("memory.cap_mib=4096", ["memory.cap_mib", "set it to 0"], "memory.cap_mib=4096 on the CPU"),
                      ("memory.expandable_segments=true", ["memory.expandable_segments", "set it to false"],
                       "memory.expandable_segments=true on the CPU")]


def cases(ctx):
    binary, launcher = ctx.bindir / "sharded_training", ctx.bindir / "amplab-run"
    if not binary.exists() or not launcher.exists():
        return []
    found = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        def two_ranks(sig=sig):
            out_dir = tempfile.mkdtemp(dir=ctx.out_root)
            cmd = [str(launcher), "--nproc-per-node", "2", "--", str(binary), "--set", f"run.out_dir={out_dir}"] + LONG_RUN
            rc, out, sent = run_stopped_at(cmd, STOP["after"], sig, 120)
            return stopped_well(rc, out, sent, sig, out_dir, "sharded_training", " ".join(cmd))
        found.append(Case(f"stop/sharded_training/{signal.Signals(sig).name} on 2 ranks, in a training step", "stop",
                          two_ranks, 150))
    return found
