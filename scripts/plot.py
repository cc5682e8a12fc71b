#!/usr/bin/env python3
"""PNG plots of a lab run, from the files the run directory already holds.

    scripts/plot.py LAB RUN_DIR          the lab's own plots: labs/LAB/plots.py's draw(RUN_DIR)
    scripts/plot.py gpu_monitor RUN_DIR  gpu_monitor.png (any GPU run: utilization, power, memory over time)

A lab's plots live beside its code (labs/<lab>/plots.py, which imports the helpers below from
this file); the lab binary asks for them by the lab's name (labs/<lab>/lab.yaml).
"""
import csv
import importlib.util
import json
import os
import pathlib
import re
import sys

NO_MATPLOTLIB = 3  # the exit code the lab binaries read as "matplotlib is not installed"
try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: E402
except ImportError as e:
    print(f"plot.py: matplotlib is not installed for {sys.executable} ({e}); scripts/setup.sh installs it",
          file=sys.stderr)
    sys.exit(NO_MATPLOTLIB)


def load_summary(run_dir):
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def save(fig, run_dir, name):
    path = os.path.join(run_dir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"plot: {path}")


def plot_gpu_monitor(run_dir):
    """SM utilization, power and memory used over the run, one colour band per phase."""
    rows = read_csv(os.path.join(run_dir, "gpu_monitor.csv"))
    if not rows:
        raise ValueError("gpu_monitor.csv has no samples")
    t = [float(r["time_s"]) for r in rows]
    fig, axes = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    series = [("sm_util_pct", "SM utilization (%)"), ("power_w", "power (W)"), ("memory_used_mib", "memory used (MiB)")]
    for ax, (key, label) in zip(axes, series):
        ax.plot(t, [float(r[key]) for r in rows], linewidth=0.8)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    # Shade each phase and name it once, on the top panel.
    start, colours, colour_of = 0, plt.rcParams["axes.prop_cycle"].by_key()["color"], {}
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i]["phase"] != rows[start]["phase"]:
            name = rows[start]["phase"]
            if name:
                colour = colour_of.setdefault(name, colours[len(colour_of) % len(colours)])
                for ax in axes:
                    ax.axvspan(t[start], t[i - 1], color=colour, alpha=0.12, linewidth=0)
                axes[0].text(t[start], 102, name, fontsize=7, rotation=30, va="bottom")
            start = i
    axes[0].set_ylim(0, 100)
    axes[-1].set_xlabel("seconds since the run started")
    save(fig, run_dir, "gpu_monitor.png")


def lab_plots(lab):
    """labs/<lab>/plots.py's draw(), or None when `lab` is not a lab with plots."""
    path = pathlib.Path(__file__).resolve().parent.parent / "labs" / lab / "plots.py"
    if not re.fullmatch(r"[a-z0-9_]+", lab) or not path.is_file():
        return None
    sys.modules.setdefault("plot", sys.modules[__name__])  # the lab's file imports this one as `plot`
    spec = importlib.util.spec_from_file_location(f"{lab}_plots", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.draw


def main():
    draw = None
    if len(sys.argv) == 3:
        draw = plot_gpu_monitor if sys.argv[1] == "gpu_monitor" else lab_plots(sys.argv[1])
    if draw is None:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        draw(sys.argv[2])
    except OSError as e:  # a file it cannot read or write: a full disk, a permission
        print(f"plot.py: cannot plot {sys.argv[1]} in {sys.argv[2]}: {e.strerror or e}"
              f"{' (' + e.filename + ')' if e.filename else ''}", file=sys.stderr)
        return 1
    except (KeyError, ValueError, TypeError) as e:  # a run directory the plots cannot read
        print(f"plot.py: cannot plot {sys.argv[1]} from {sys.argv[2]}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
