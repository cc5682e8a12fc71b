"""This lab's plots, drawn at the end of a run by scripts/plot.py mnist RUN_DIR:
epoch_time.png (per mode), accuracy.png (per epoch), from the files the run directory holds."""

from plot import load_summary, plt, save  # noqa: E402  (scripts/plot.py, which loads this file)


def draw(run_dir):
    modes = [m for m in load_summary(run_dir)["modes"] if m["ran"]]
    if not modes:
        return
    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = [m["mode"] for m in modes]
    seconds = [m["seconds_per_epoch"] for m in modes]
    bars = ax.barh(names, seconds, color="#4c72b0")
    ax.set_xscale("log")
    ax.set_xlabel("seconds per epoch (log scale, lower is better)")
    ax.invert_yaxis()
    for bar, s in zip(bars, seconds):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {s:.3g} s", va="center")
    ax.set_title("MNIST: time per epoch")
    save(fig, run_dir, "epoch_time.png")

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for m in modes:
        epochs = list(range(1, len(m["test_accuracy"]) + 1))
        ax.plot(epochs, m["test_accuracy"], marker="o", label=m["mode"])
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy")
    ax.set_title("MNIST: test accuracy per epoch")
    ax.legend()
    ax.grid(alpha=0.3)
    save(fig, run_dir, "accuracy.png")
