"""This lab's plots, drawn at the end of a run by scripts/plot.py transformer_fp8 RUN_DIR:
loss_curve.png (loss per step and precision), from the files the run directory holds."""
import os

from plot import plt, read_csv, save  # noqa: E402  (scripts/plot.py, which loads this file)


def draw(run_dir):
    # Validation (solid) and training (dotted) loss per step, one line per precision.
    rows = read_csv(os.path.join(run_dir, "losses.csv"))
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
    save(fig, run_dir, "loss_curve.png")
