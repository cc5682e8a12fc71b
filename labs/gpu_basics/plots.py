"""This lab's plots, drawn at the end of a run by scripts/plot.py gpu_basics RUN_DIR:
matmul.png (TFLOP/s and the GPU's speed-up over the CPU against n), from the files the run directory holds."""
import os

from plot import plt, read_csv, save  # noqa: E402  (scripts/plot.py, which loads this file)


def draw(run_dir):
    """The matmul sweep: TFLOP/s against n per device and dtype, and the GPU's speed-up over the CPU."""
    rows = read_csv(os.path.join(run_dir, "matmul.csv"))
    if not rows:
        raise ValueError("matmul.csv has no rows")
    def number(text):
        return float(text) if text not in ("", "nan") else None
    fig, (speed, ratio) = plt.subplots(1, 2, figsize=(11, 4.2))
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        mine = [r for r in rows if r["dtype"] == dtype]
        for key, style, device in (("gpu_tflops", "-o", "GPU"), ("cpu_tflops", "--s", "CPU")):
            points = [(int(r["n"]), number(r[key])) for r in mine if number(r[key])]
            if points:
                speed.plot(*zip(*points), style, label=f"{device} {dtype}", markersize=4)
        points = [(int(r["n"]), number(r["gpu_over_cpu"])) for r in mine if number(r["gpu_over_cpu"])]
        if points:
            ratio.plot(*zip(*points), "-o", label=dtype, markersize=4)
    speed.set(xscale="log", yscale="log", xlabel="n (n x n x n matmul)", ylabel="TFLOP/s", title="Matmul throughput")
    ratio.set(xscale="log", yscale="log", xlabel="n", ylabel="GPU / CPU", title="The GPU's speed-up over the CPU")
    ratio.axhline(1, color="grey", linewidth=0.8)
    sizes = sorted({int(r["n"]) for r in rows})
    for ax in (speed, ratio):
        ax.set_xticks(sizes, [str(n) for n in sizes], fontsize=7)
        ax.minorticks_off()
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    save(fig, run_dir, "matmul.png")
