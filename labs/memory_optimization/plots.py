"""This lab's plots, drawn at the end of a run by scripts/plot.py memory_optimization RUN_DIR:
memory_timeline.png (one step's phases), memory_batch.png, from the files the run directory holds."""
import os

from plot import plt, read_csv, save  # noqa: E402  (scripts/plot.py, which loads this file)


def draw(run_dir):
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
