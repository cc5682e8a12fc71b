"""This lab's plots, drawn at the end of a run by scripts/plot.py ddp RUN_DIR:
ddp_scaling.png, from the files the run directory holds."""
import os

from plot import load_summary, plt, save  # noqa: E402  (scripts/plot.py, which loads this file)


def draw(run_dir):
    if not os.path.exists(os.path.join(run_dir, "summary.json")):
        return
    rows = load_summary(run_dir).get("bench", [])
    if not rows:
        return
    # One bar per setting, top to bottom in the bench's order, each with its time and efficiency.
    fig, ax = plt.subplots(figsize=(8, 0.8 + 0.45 * len(rows)))
    ms = [float(r["step_ms"]) for r in rows]
    y = list(range(len(rows)))[::-1]
    ax.barh(y, ms, color="#4c72b0")
    ax.set_yticks(y, [r["setting"] for r in rows])
    for yi, t, r in zip(y, ms, rows):
        ax.text(t, yi, f" {t:.2f} ms ({100 * float(r['efficiency']):.1f}%)", va="center", fontsize=8)
    ax.set_xlim(0, max(ms) * 1.3)
    ax.set_xlabel("ms per step (efficiency: time alone / time of the setting)")
    ax.set_title("DDP: time per step")
    save(fig, run_dir, "ddp_scaling.png")
