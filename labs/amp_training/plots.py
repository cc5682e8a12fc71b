"""This lab's plots, drawn at the end of a run by scripts/plot.py amp_training RUN_DIR:
precision.png (time per step and memory per precision), from the files the run directory holds."""
import os

from plot import plt, read_csv, save  # noqa: E402  (scripts/plot.py, which loads this file)


def draw(run_dir):
    rows = [r for r in read_csv(os.path.join(run_dir, "precision.csv")) if r.get("ran", "yes") == "yes"]
    if not rows:
        return
    models = list(dict.fromkeys(r["model"] for r in rows))  # in run order
    fig, axes = plt.subplots(len(models), 2, figsize=(10, 3.2 * len(models)), squeeze=False)
    for i, model in enumerate(models):
        sub = [r for r in rows if r["model"] == model]
        # the console's label: fp16-mixed without its scaler, the "scaler cost" reference, says so
        names = [r["label"].replace(" (", "\n(") for r in sub]
        ms = [float(r["step_ms_median"]) for r in sub]
        bars = axes[i][0].bar(names, ms, color="#4c72b0")
        for bar, r in zip(bars, sub):
            speedup = float(r.get("speedup_vs_fp32") or 0)
            if speedup > 0:
                axes[i][0].annotate(f"{speedup:.2g}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                                    ha="center", va="bottom", fontsize=8)
        axes[i][0].set_ylabel("ms per step (median)")
        axes[i][0].set_title(f"{model}: time per step (speed-up vs fp32)")
        axes[i][1].bar(names, [float(r["peak_mib"]) for r in sub], color="#dd8452")
        axes[i][1].set_ylabel("peak MiB")
        axes[i][1].set_title(f"{model}: peak memory")
        for ax in axes[i]:
            ax.tick_params(axis="x", labelsize=8)
    save(fig, run_dir, "precision.png")
