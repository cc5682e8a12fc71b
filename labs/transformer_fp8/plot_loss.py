#!/usr/bin/env python3
"""loss_curve.png of a transformer_fp8 run: validation (and training) loss per step, one line per
precision, from the run's losses.csv.

    labs/transformer_fp8/plot_loss.py RUN_DIR
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    run_dir = sys.argv[1]
    with open(os.path.join(run_dir, "losses.csv")) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for name in dict.fromkeys(r["row"] for r in rows):
        mine = [r for r in rows if r["row"] == name]
        steps = [int(r["step"]) for r in mine]
        line, = ax.plot(steps, [float(r["val_loss"]) for r in mine], marker="o", label=f"{name} (val)")
        ax.plot(steps, [float(r["train_loss"]) for r in mine], linestyle=":", color=line.get_color())
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per character)")
    ax.set_title("GPT on Shakespeare: validation loss (solid), training loss (dotted)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(run_dir, "loss_curve.png")
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
