#!/usr/bin/env bash
# The MNIST lab and the Python reference on this GPU, one after the other, then one table of
# ratios (bench/side_by_side.py). Run from the project root after a build, on a GPU machine:
#
#   bench/side_by_side.sh [OUT_DIR]        (default: runs/side_by_side)
#
# C++: build/bin/mnist with configs/mnist.yaml, GPU modes only, 2 epochs (the second is warm).
# Python: bench/run_reference.sh --skip-cpu --skip-compile (DataLoader, resident and CUDA-graph
# variants, 2 epochs each), every run with the optimizer, lr schedule, batch and drop_last of the
# config the lab just ran (its resolved config in summary.json, read by side_by_side.py
# --reference-flags): AdamW, linear decay after a 5% warm-up with configs/mnist.yaml.
# About 2-3 minutes on an H200. BIN (default build/bin) picks the build.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-runs/side_by_side}"
bin="${BIN:-build/bin}"
python="${PYTHON:-python3}"
[[ -x "$bin/mnist" ]] || { echo "side_by_side: no $bin/mnist; build first (scripts/setup.sh)" >&2; exit 1; }
mkdir -p "$out"
"$bin/mnist" --config "$here/../configs/mnist.yaml" --set mnist.modes=[gpu,gpu-amp] --set train.epochs=2 \
  --set mnist.plots=false --set run.out_dir="$out/cpp" >"$out/cpp.log" 2>&1 || { tail -5 "$out/cpp.log" >&2; exit 1; }
summary=$(ls -t "$out"/cpp/mnist/*/summary.json | head -1)
# The lab's resolved config (--set overrides applied, defaults filled in; summary.json keeps it)
# -> mnist_reference.py flags.
flags=$("$python" "$here/side_by_side.py" --reference-flags "$summary") || exit 1
read -ra ref_flags <<<"$flags"
echo "side_by_side: Python runs with the lab's settings: ${ref_flags[*]}" >&2
EPOCHS=2 PYTHON="$python" bash "$here/run_reference.sh" "$out/python" --skip-cpu --skip-compile -- "${ref_flags[@]}" \
  >"$out/python.log" 2>&1 ||
  echo "side_by_side: some Python runs failed (see $out/python.log)" >&2
"$python" "$here/side_by_side.py" "$summary" "$out/python" | tee "$out/table.txt"
