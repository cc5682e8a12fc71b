#!/usr/bin/env python3
"""Reads the JSON results of bench/mnist_reference.py in a directory (as bench/run_reference.sh
writes them), prints one table, and writes DIR/summary.json holding every run.

  python3 bench/reference_table.py DIR
"""

import json
import sys
from pathlib import Path

# The reference figures the labs' READMEs quote for these runs (seconds per epoch,
# one H200), printed beside the measured ones. That table does not say whether an epoch is the
# first or a warm one, so compare with both columns.
QUOTED_SECONDS = {
    "cpu-fp32-dataloader": 8.2,  # with 32 CPU threads
    "cuda-fp32-dataloader": 1.17,
    "cuda-fp16-dataloader": 1.61,
    "cuda-fp32-resident": 0.83,
    "cuda-fp16-resident": 1.02,
    "cuda-bf16-resident": 1.06,
    "cuda-bf16-graph": 0.237,
    "cuda-bf16-compile": 1.29,
}


def fmt(value, spec):
    return "-" if value is None else format(value, spec)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip())
    directory = Path(sys.argv[1])
    runs = []
    for path in sorted(directory.glob("*.json")):
        if path.name == "summary.json":
            continue
        try:
            result = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            result = {"status": "failed", "variant": path.stem, "error": f"unreadable JSON: {e}"}
        result["run"] = path.stem
        runs.append(result)
    if not runs:
        sys.exit(f"reference_table: no result JSON files in {directory}")

    header = ["run", "epoch 1 s", "warm s", "ms/step", "samples/s", "loss", "test acc", "quoted s", "device"]
    rows = []
    for r in runs:
        name = r["run"].split("-", 1)[1] if r["run"][:2].isdigit() else r["run"]
        if r.get("status") != "ok":
            rows.append([r["run"], "FAILED", "", "", "", "", "", fmt(QUOTED_SECONDS.get(name), ".3g"),
                         r.get("log", r.get("error", ""))])
            continue
        last = r["epochs"][-1]
        # Throughput of a warm epoch when there is one, else of the (only) first epoch.
        per_s = r["warm_samples_per_s"] or r["epochs"][0]["samples_per_s"]
        ms_step = r["warm_ms_per_step"] or 1e3 * r["first_epoch_s"] / r["steps_per_epoch"]
        rows.append([r["run"], fmt(r["first_epoch_s"], ".3f"), fmt(r["warm_epoch_s"], ".3f"), fmt(ms_step, ".3f"),
                     fmt(per_s, ".0f"), fmt(last["train_loss"], ".4f"), fmt(last["test_acc"], ".4f"),
                     fmt(QUOTED_SECONDS.get(name), ".3g"),
                     f"{r['env']['device_name']} ({r['env']['cpu_threads']} threads)"
                     if r["config"]["device"] == "cpu" else r["env"]["device_name"]])

    widths = [max(len(str(row[i])) for row in [header] + rows) for i in range(len(header))]
    for row in [header, ["-" * w for w in widths]] + rows:
        print("  ".join(str(c).ljust(w) if i in (0, len(row) - 1) else str(c).rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths))))
    ok = [r for r in runs if r.get("status") == "ok"]
    if ok:
        print(f"torch {ok[0]['env']['torch']}; ms/step and samples/s of the warm epoch (of epoch 1 when there is "
              f"only one); quoted s: the figure the READMEs quote")

    summary = directory / "summary.json"
    summary.write_text(json.dumps({"runs": runs}, indent=2) + "\n")
    print(f"wrote {summary}")
    return 0 if len(ok) == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
