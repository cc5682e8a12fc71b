#!/usr/bin/env bash
# Checks the ddp lab on a GPU machine with two GPUs (kind nvidia-h200-x2). Run it in the project
# root with the project built in build-gpu/ (README.md, "Build details"), e.g. in one device
# command:
#   bash .device/gpu-build.sh && . .device/env.sh && bash labs/ddp/gpu-check.sh
# It prints, and writes to $OUT when set (at most 8 files: tests.log, checks.log, bench_1gpu.log,
# bench_2gpu.log, summary_2gpu.json, timeline_2gpu.json, report_2gpu.md, pytorch_ddp.log):
#   1. the graded tests on the solution, the *_CUDA ones included: each version trains the lab
#      identically on two GPUs over NCCL, and the bucketed version's step time against the
#      reference's (its ratio and the share of the points);
#   2. the reference's own NCCL tests (dist_test's Nccl.*); the lab trained on two GPUs through
#      torchrun --no-python;
#   3. with --certify: scripts/grade --certify, the rubric certified by the grader itself, GPU tests
#      included (the untouched starter, each TODO emptied alone, fails every test graded with it);
#   4. the bench on one GPU (no launcher: the baseline) and on two (amplab-run), every version side
#      by side, with the timeline of the bucketed setting; then PyTorch's DDP on the same MLP
#      (bench/ddp_reference.py) for comparison.
# Usage: bash labs/ddp/gpu-check.sh [--certify] [BUILD_DIR]   (exit 1 when a check failed)
# In a student hand-out (no solution/) it runs the starter's tests: your code.
set -uo pipefail
certify=0
while [ $# -gt 0 ]; do
  case "$1" in
    --certify) certify=1 ;;
    *) break ;;
  esac
  shift
done
build=${1:-build-gpu}
tests="$build/bin/ddp_test_solution"
lab="$build/bin/ddp"
[ -x "$tests" ] || tests="$build/bin/ddp_test_starter"  # a hand-out builds the starter only
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
work=$(mktemp -d)
status=0
say() { printf '\n=== %s ===\n' "$*"; }
export AMPLAB_SOURCE_DIR=$PWD AMPLAB_BINARY_DIR=$PWD/$build
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv,noheader || true
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$gpus" -ge 2 ] || echo "warning: $gpus GPU(s): the two-GPU checks will skip (ask for nvidia-h200-x2)"

say "1. graded tests ($tests)"
"$tests" --gtest_output="json:$work/tests.json" > "$out/tests.log" 2>&1 || status=1
sed -n '/Global test environment tear-down/,$p' "$out/tests.log" | tail -n +2 | head -40
grep -B1 -A12 -E '^[^ ]+:[0-9]+: Failure' "$out/tests.log" | head -80
grep -E '^bucketed .* ms/step' "$out/tests.log"
python3 - "$work/tests.json" <<'PY'
import json, sys
for suite in json.load(open(sys.argv[1]))["testsuites"]:
    for t in suite["testsuite"]:
        if "speed_ratio" in t:
            print(f"speed  {suite['name']}.{t['name']}: {float(t['speed_ratio']):.3f}x the reference's step time, "
                  f"points {100 * float(t['points_fraction']):.0f}%")
PY

say "2. the reference's NCCL tests, torchrun"
{
  if [ -d solution ]; then
    echo "--- dist_test Nccl.* (the reference DDP over NCCL)"
    "$build/bin/dist_test" --gtest_filter='Nccl.*' 2>&1 | tail -4 || status=1
  fi
  echo "--- torchrun --no-python, 2 GPUs, dist.sync=bucketed (Fashion-MNIST, 1 epoch)"
  if command -v torchrun >/dev/null; then
    torchrun --standalone --nproc-per-node 2 --no-python "$lab" --set run.out_dir="$work/runs" \
      --set train.epochs=1 2>&1 | grep -E 'parameters identical|error|epoch' | tail -5 || status=1
  else
    echo "skipped: no torchrun here"
  fi
  for sync in naive flat overlapped; do
    echo "--- amplab-run, 2 GPUs, dist.sync=$sync (1 epoch)"
    "$build/bin/amplab-run" --nproc-per-node 2 -- "$lab" --set run.out_dir="$work/runs" --set train.epochs=1 \
      --set dist.sync=$sync 2>&1 | grep -E 'parameters identical|error|epoch' | tail -3 || status=1
  done
} > "$out/checks.log" 2>&1  # not piped: a pipe would run the block in a subshell and lose its status
cat "$out/checks.log"

if [ "$certify" = 1 ] && [ -d solution ]; then
  say "3. scripts/grade --certify (reconfigures $build with AMPLAB_GRADING=ON)"
  python3 scripts/grade --certify --lab ddp --build "$build" --out "$work/certify" 2>&1 |
    grep -vE '^(grade:|  not checked)' || status=1
fi

say "4. the bench: one GPU, then two"
CUDA_VISIBLE_DEVICES=0 "$lab" --set bench.enabled=true --set bench.steps=50 --set run.out_dir="$work/bench1" \
  > "$out/bench_1gpu.log" 2>&1 || status=1
sed -n '/^MLP /,$p' "$out/bench_1gpu.log"
"$build/bin/amplab-run" --nproc-per-node 2 -- "$lab" --set bench.enabled=true --set bench.steps=50 \
  --set bench.trace=true --set run.out_dir="$work/bench2" > "$out/bench_2gpu.log" 2>&1 || status=1
sed -n '/MLP /,$p' "$out/bench_2gpu.log"
run_dir=$(ls -d "$work"/bench2/ddp/*/ 2>/dev/null | tail -1)
if [ -n "$run_dir" ]; then
  cp "$run_dir/summary.json" "$out/summary_2gpu.json"
  [ -f "$run_dir/timeline_bucketed.json" ] && cp "$run_dir/timeline_bucketed.json" "$out/timeline_2gpu.json"
  [ -f "$run_dir/report.md" ] && cp "$run_dir/report.md" "$out/report_2gpu.md"
fi
if command -v torchrun >/dev/null; then
  torchrun --standalone --nproc-per-node 2 bench/ddp_reference.py --steps 50 > "$out/pytorch_ddp.log" 2>&1 || status=1
  tail -4 "$out/pytorch_ddp.log"
fi
rm -rf "$work"
say "gpu-check: $([ $status = 0 ] && echo 'all checks passed' || echo 'FAILED (see above)')"
exit $status
