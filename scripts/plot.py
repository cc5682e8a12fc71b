#!/usr/bin/env python3
"""PNG plots of a lab run, from the files the run directory already holds.

    scripts/plot.py mnist  RUN_DIR   epoch_time.png (per mode), accuracy.png (per epoch)
    scripts/plot.py amp    RUN_DIR   precision.png (time per step and memory per precision)
    scripts/plot.py memory RUN_DIR   memory_timeline.png (one step's phases), memory_batch.png
    scripts/plot.py ddp    RUN_DIR   ddp_scaling.png
    scripts/plot.py kernels RUN_DIR  roofline.png, bandwidth.png (cuda_kernels lab)
    scripts/plot.py gpt    RUN_DIR   loss_curve.png (transformer_fp8 lab: loss per step and precision)
    scripts/plot.py gpu_basics RUN_DIR   matmul.png (TFLOP/s and the GPU's speed-up over the CPU against n)
    scripts/plot.py gpu_monitor RUN_DIR  gpu_monitor.png (any GPU run: utilization, power, memory over time)
"""
import csv
import json
import os
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


def plot_mnist(run_dir):
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


def plot_amp(run_dir):
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


def plot_memory(run_dir):
    timeline = os.path.join(run_dir, "memory_timeline.csv")
    if os.path.exists(timeline):
        rows = read_csv(timeline)
        if rows and "setting" in rows[0]:
            # One step per setting, a sample after each block in forward and backward: allocated
            # memory in program order, the phases shaded.
            settings = list(dict.fromkeys(r["setting"] for r in rows))
            fig, ax = plt.subplots(figsize=(8, 4))
            colors = {"forward": "#4c72b0", "backward": "#dd8452", "optimizer": "#55a868"}
            for i, setting in enumerate(settings):
                sub = [r for r in rows if r["setting"] == setting]
                xs = [j / max(1, len(sub) - 1) for j in range(len(sub))]  # fraction of the step
                ys = [float(r["allocated_mib"]) for r in sub]
                ax.plot(xs, ys, marker=".", label=setting, color=f"C{i}")
                if i == 0:
                    for j, r in enumerate(sub):
                        ax.axvspan(xs[j] - 0.5 / len(sub), xs[j] + 0.5 / len(sub), color=colors.get(r["phase"], "#999999"),
                                   alpha=0.08, lw=0)
            ax.set_xlabel("position in the step (samples in program order; shading: forward, backward, optimizer)")
            ax.set_ylabel("allocated MiB (" + rows[0]["source"] + ")")
            ax.set_title("memory through one training step")
            ax.legend()
            ax.grid(alpha=0.3)
            save(fig, run_dir, "memory_timeline.png")
        elif rows:
            steps = sorted({int(r["step"]) for r in rows})
            step = steps[len(steps) // 2]  # a step in the middle: warm, representative
            sub = [r for r in rows if int(r["step"]) == step and r.get("event", "phase_end") == "phase_end"]
            fig, ax = plt.subplots(figsize=(7, 3.5))
            names = [r["phase"] for r in sub]
            ax.bar(names, [float(r["peak_allocated_mib"]) for r in sub], label="peak allocated", color="#c44e52")
            ax.bar(names, [float(r["allocated_mib"]) for r in sub], label="allocated at phase end", color="#4c72b0")
            ax.set_ylabel("MiB (" + sub[0]["source"] + ")")
            ax.set_title(f"memory by phase, step {step}")
            ax.legend()
            save(fig, run_dir, "memory_timeline.png")
    per_batch = os.path.join(run_dir, "memory_per_batch.csv")
    if os.path.exists(per_batch):
        rows = read_csv(per_batch)
        key = "setting" if rows and "setting" in rows[0] else "precision"
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for setting in list(dict.fromkeys(r[key] for r in rows)):
            sub = [r for r in rows if r[key] == setting and r["fits"] == "yes"]
            if not sub:
                continue
            batches = [int(r["batch"]) for r in sub]
            line = axes[0].plot(batches, [float(r["peak_mib"]) for r in sub], marker="o", label=setting)
            if "samples_per_s" in sub[0]:
                axes[1].plot(batches, [float(r["samples_per_s"]) for r in sub], marker="o", label=setting,
                             color=line[0].get_color())
            ooms = [int(r["batch"]) for r in rows if r[key] == setting and r["fits"] == "no"]
            if ooms:  # where the setting first ran out of memory
                axes[0].axvline(min(ooms), color=line[0].get_color(), ls=":", lw=1)
        for ax in axes:
            ax.set_xscale("log", base=2)
            ax.set_xlabel("batch size")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("peak MiB")
        axes[0].set_title("peak memory per batch size (dotted: first OOM)")
        axes[1].set_ylabel("samples / s")
        axes[1].set_title("throughput per batch size")
        axes[0].legend(fontsize=8)
        save(fig, run_dir, "memory_batch.png")


def plot_ddp(run_dir):
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


def plot_kernels(run_dir):
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


def plot_gpt(run_dir):
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


def plot_gpu_basics(run_dir):
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


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in {"mnist", "amp", "memory", "ddp", "kernels", "gpt", "gpu_basics", "gpu_monitor"}:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        {"mnist": plot_mnist, "amp": plot_amp, "memory": plot_memory, "ddp": plot_ddp,
         "kernels": plot_kernels, "gpt": plot_gpt, "gpu_basics": plot_gpu_basics, "gpu_monitor": plot_gpu_monitor}[sys.argv[1]](sys.argv[2])
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
