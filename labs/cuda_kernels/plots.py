"""This lab's plots, drawn at the end of a run by scripts/plot.py cuda_kernels RUN_DIR:
roofline.png, bandwidth.png, from the files the run directory holds."""
import os

from plot import load_summary, plt, read_csv, save  # noqa: E402  (scripts/plot.py, which loads this file)


def draw(run_dir):
    roofs = load_summary(run_dir).get("roofs", {})
    path = os.path.join(run_dir, "roofline.csv")
    if roofs.get("memory_gbs"):
        # Achieved FLOP/s against arithmetic intensity (the cost model's FLOPs per byte), log-log,
        # under the roofs: min(compute peak, intensity x memory bandwidth), both measured. No
        # roofline.csv (no kernel timed with a cost model yet): the roofs alone.
        rows = read_csv(path) if os.path.exists(path) else []
        fig, ax = plt.subplots(figsize=(9, 5.5))
        memory = float(roofs["memory_gbs"])  # GB/s
        xs = [10 ** (e / 20) for e in range(-40, 81)]  # 0.01 .. 10^4 FLOP/byte
        for key, label, style in (("fp32_tflops", "fp32 peak (cuBLAS, TF32 off)", "-"),
                                  ("bf16_tflops", "bf16 tensor-core peak (cuBLAS)", "--")):
            peak = roofs.get(key)
            if peak:
                ax.plot(xs, [min(peak, x * memory / 1e3) for x in xs], style, color="0.3", lw=1.2,
                        label=f"roof: {label} {peak:.0f} TFLOP/s")
        markers = {"elementwise": "o", "reduction": "s", "convolution": "^", "matmul": "D", "matmul bf16": "P"}
        for part in dict.fromkeys(r["part"] for r in rows):
            sub = [r for r in rows if r["part"] == part]
            ax.scatter([float(r["intensity"]) for r in sub], [float(r["tflops"]) for r in sub],
                       marker=markers.get(part, "o"), s=36, label=part, zorder=3)
            for r in sub:
                ax.annotate(r["kernel"], (float(r["intensity"]), float(r["tflops"])), fontsize=7,
                            xytext=(4, 2), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP per byte of the least DRAM traffic)")
        ax.set_ylabel("achieved TFLOP/s")
        ax.set_title(f"roofline: memory {memory:.0f} GB/s (device copy)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="lower right")
        save(fig, run_dir, "roofline.png")
    path = os.path.join(run_dir, "bandwidth.csv")
    if os.path.exists(path) and roofs.get("memory_gbs"):
        rows = read_csv(path)
        fig, ax = plt.subplots(figsize=(8, 0.8 + 0.4 * len(rows)))
        y = list(range(len(rows)))[::-1]
        gbs = [float(r["gbs"]) for r in rows]
        ax.barh(y, gbs, color=["#dd8452" if r["ours"] == "no" else "#4c72b0" for r in rows])
        ax.set_yticks(y, [f"{r['part']}: {r['kernel']}" for r in rows], fontsize=8)
        ax.axvline(float(roofs["memory_gbs"]), color="k", ls=":", lw=1)
        for yi, g in zip(y, gbs):
            ax.text(g, yi, f" {g:.0f}", va="center", fontsize=7)
        ax.set_xlabel("effective GB/s (dotted: device copy; orange: PyTorch)")
        ax.set_title("memory-bound kernels: effective bandwidth")
        save(fig, run_dir, "bandwidth.png")
