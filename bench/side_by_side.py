#!/usr/bin/env python3
"""One table: the MNIST lab (C++) against the Python reference, measured on this GPU in this run.

Reads the lab's summary.json (build/bin/mnist) and the Python runs' JSON files
(bench/run_reference.sh), and prints, for every Python run, its warm epoch and the C++ mode it
compares with, with the ratio Python s / C++ s (above 1: C++ is faster). bench/side_by_side.sh
runs both and then this. With --reference-flags it prints instead the bench/mnist_reference.py
flags that train as the lab's run did (its resolved config, kept in summary.json): optimizer, lr
schedule, batch, drop_last.

    python3 bench/side_by_side.py CPP_SUMMARY_JSON PYTHON_DIR
    python3 bench/side_by_side.py --reference-flags CPP_SUMMARY_JSON
"""
import json
import sys
from pathlib import Path

# What bench/mnist_reference.py fixes for AdamW (ADAMW_BETA1, ADAMW_EPS there).
REFERENCE_ADAMW_FIXED = {"beta1": 0.9, "eps": 1e-8}


def read_summary(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"side_by_side: cannot read the lab's summary {path}: {e}")


def reference_flags(summary_path):
    """mnist_reference.py flags for the lab run's train.optimizer (and the batch and drop_last,
    which fix the schedule's length), from the resolved config the lab keeps in summary.json;
    exits on settings the reference cannot mirror."""
    config = read_summary(summary_path).get("config")
    if not isinstance(config, dict):
        sys.exit(f"side_by_side: {summary_path} has no 'config' (written by build/bin/mnist from this version on)")
    train = config["train"]
    o = train["optimizer"]
    def die(why):
        sys.exit(f"side_by_side: {summary_path}: train.optimizer: {why}; bench/mnist_reference.py cannot mirror it")
    def number(key):
        if isinstance(o[key], bool) or not isinstance(o[key], (int, float)):
            die(f"{key} {o[key]!r} is not a number")
        return str(o[key])
    if o["name"] not in ("sgd", "adamw"):
        die(f"name {o['name']} (the reference has sgd and adamw)")
    flags = ["--optimizer", o["name"], "--lr", number("lr"), "--weight-decay", number("weight_decay"),
             "--schedule", o["schedule"], "--warmup", number("warmup")]
    fused = train["fast_path"]  # the lab's optimizer is fused on its fast path
    if o["name"] == "sgd":
        flags += ["--momentum", number("momentum")] + (["--fused"] if fused else [])
    else:
        for key, fixed in REFERENCE_ADAMW_FIXED.items():
            if float(o[key]) != fixed:
                die(f"{key} {o[key]} (the reference's AdamW has {key} {fixed})")
        flags += ["--beta2", number("beta2")]
        if not fused:  # the reference's AdamW is always fused on CUDA
            print(f"side_by_side: {summary_path}: the lab's AdamW is not fused, the reference's is", file=sys.stderr)
    flags += ["--batch-size", str(train["batch_size"]), "--drop-last" if train["drop_last"] else "--no-drop-last"]
    return flags


def counterpart(variant):
    """The C++ mode of the same device and precision as a Python run ("cuda bf16-mixed resident
    cuda-graph" -> "gpu-amp (bf16-mixed)"). The C++ lab keeps the data on the GPU and replays the
    step as a CUDA graph in every GPU mode."""
    words = variant.split()
    if "cpu" in words:
        return "cpu"
    for precision in ("fp16-mixed", "bf16-mixed"):
        if precision in words:
            return f"gpu-amp ({precision})"
    return "gpu"  # fp32 (and tf32: the lab's gpu mode is fp32)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--reference-flags":
        print(" ".join(reference_flags(sys.argv[2])))
        return
    if len(sys.argv) != 3:
        sys.exit("usage:\n" + "\n".join(__doc__.strip().splitlines()[-2:]))
    summary_path, python_dir = Path(sys.argv[1]), Path(sys.argv[2])
    summary = read_summary(summary_path)
    cpp = {m["mode"]: m for m in summary.get("modes", []) if m.get("ran")}
    runs = []
    for path in sorted(python_dir.glob("*.json")):
        if path.name == "summary.json":
            continue
        try:
            r = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if r.get("benchmark") == "mnist_reference":
            runs.append(r)
    if not runs:
        sys.exit(f"side_by_side: no Python results (*.json of bench/mnist_reference.py) in {python_dir}")

    print(f"MNIST lab (C++) against PyTorch in Python, same machine, same run; batch {summary.get('batch_size')}, "
          f"{summary.get('dataset')}")
    optimizers = sorted({r["optimizer"]["description"] for r in runs if r.get("optimizer")})
    for description in optimizers:
        print(f"python optimizer: {description}")
    header = f"{'python run':36s} {'python s':>9s} {'acc':>6s}  {'c++ mode':22s} {'c++ s':>7s} {'acc':>6s} {'python / c++':>12s}"
    print(header)
    print("-" * len(header))
    for r in runs:
        variant = r.get("variant", "?")
        if r.get("status") != "ok":
            print(f"{variant:36s} {'failed':>9s}")
            continue
        py_s = r.get("warm_epoch_s") or r.get("first_epoch_s")
        py_acc = r.get("final_test_acc")
        mode = counterpart(variant)
        m = cpp.get(mode)
        if m is None:
            print(f"{variant:36s} {py_s:9.3f} {py_acc:6.4f}  {'(' + mode + ' not run)':22s}")
            continue
        cpp_s = m["seconds_per_epoch"]
        cpp_acc = m["test_accuracy"][-1] if m.get("test_accuracy") else float("nan")
        print(f"{variant:36s} {py_s:9.3f} {py_acc:6.4f}  {mode:22s} {cpp_s:7.3f} {cpp_acc:6.4f} {py_s / cpp_s:11.2f}x")
    print("seconds per epoch: the warm epoch (the last) of each side; acc: test accuracy after the last epoch")


if __name__ == "__main__":
    main()
