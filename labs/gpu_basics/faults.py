"""The gpu_basics lab's fault cases, which tests/faults/sweep.py loads (see its docstring): its quick
CPU benchmarks stand for any lab where the case is about what every run does (make its run
directory, draw its plots), not about the lab's own work.

Instructor-only: scripts/make-handout leaves labs/*/faults.py out of hand-outs.
"""
import os
import pathlib
import shutil
import tempfile

from sweep import ROOT, Case, newest_run, refused, run  # tests/faults/sweep.py, which loads this file

STOP = {"settings": [], "after": r"== Memory bandwidth", "when": "in a study"}


def out_dir_cases(bindir, out_root):
    """run.out_dir that is not what it seems."""
    if not (bindir / "gpu_basics").exists():
        return []

    def dangling():
        where = pathlib.Path(tempfile.mkdtemp(dir=out_root))
        (where / "runs").symlink_to(where / "gone")
        return refused([str(bindir / "gpu_basics"), "--set", f"run.out_dir={where / 'runs'}"],
                       ["run.out_dir", "symbolic link", "does not exist"])
    return [Case("cli/gpu_basics/run.out_dir a dangling symbolic link", "cli", dangling)]


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


def cases(ctx):
    """Every case of this file, in the order they run."""
    return out_dir_cases(ctx.bindir, ctx.out_root) + plot_cases(ctx.bindir, ctx.out_root)
