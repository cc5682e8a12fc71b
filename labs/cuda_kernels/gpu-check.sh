#!/usr/bin/env bash
# Checks the cuda_kernels lab on a GPU machine. Run it in the project root with the project built
# in build-gpu/ (README.md, "Build details", says how on a machine without the packages), e.g. in one device command:
#   bash .device/gpu-build.sh && . .device/env.sh && bash labs/cuda_kernels/gpu-check.sh
# It prints, and writes to $OUT when set (tests.log, app.log, summary.json, the plots):
#   1. the graded tests on the solution, GPU tests included, with each speed test's ratio to its
#      PyTorch baseline and the share of points it earns (tests/labs/cuda_kernels_test.cpp's
#      kReference holds the reference ratios: update it from these numbers);
#   2. with --certify: scripts/grade --certify, the rubric certified by the grader itself, GPU tests
#      included (the untouched starter, each TODO emptied alone, fails every test graded with it);
#      with --grade: scripts/grade --code solution (the partial points as the grader scores them;
#      reconfigures BUILD_DIR with AMPLAB_GRADING=ON and builds the student variant: a few minutes);
#   4. the lab binary: every part's table, the plots and the filtered images in its run directory.
# Usage: bash labs/cuda_kernels/gpu-check.sh [--certify] [--grade] [BUILD_DIR]   (exit 1 when a check failed)
# In a student hand-out (no solution/) it runs the starter's tests: your code.
set -uo pipefail
certify=0
grade=0
while [ $# -gt 0 ]; do
  case "$1" in
    --certify) certify=1 ;;
    --grade) grade=1 ;;
    *) break ;;
  esac
  shift
done
build=${1:-build-gpu}
tests="$build/bin/cuda_kernels_test_solution"
[ -x "$tests" ] || tests="$build/bin/cuda_kernels_test_starter"  # a hand-out builds the starter only
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
status=0
say() { printf '\n=== %s ===\n' "$*"; }
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader || true

say "1. graded tests ($tests)"
"$tests" --gtest_output="json:$out/tests.json" > "$out/tests.log" 2>&1 || status=1
sed -n '/Global test environment tear-down/,$p' "$out/tests.log" | tail -n +2 | head -40
grep -B1 -A12 -E '^[^ ]+:[0-9]+: Failure' "$out/tests.log" | head -80
python3 - "$out/tests.json" <<'PY'
import json, sys
for suite in json.load(open(sys.argv[1]))["testsuites"]:
    for t in suite["testsuite"]:
        if "speed_ratio" in t:
            print(f"speed  {suite['name']}.{t['name']}: ratio {float(t['speed_ratio']):.3f}, "
                  f"points {100 * float(t['points_fraction']):.0f}%")
PY
grep -E '^(float4 add|warp shuffles|tiled|register-blocked|forward \+ backward)' "$out/tests.log"

if [ "$certify" = 1 ] && [ -d solution ]; then
  say "2. scripts/grade --certify (reconfigures $build with AMPLAB_GRADING=ON)"
  python3 scripts/grade --certify --lab cuda_kernels --build "$build" --out "$(mktemp -d)" 2>&1 |
    grep -vE '^(grade:|  not checked)' || status=1
fi

if [ "$grade" = 1 ]; then
  say "3b. scripts/grade --code solution"
  if python3 -c 'import yaml' 2>/dev/null; then
    python3 scripts/grade --code solution --lab cuda_kernels --build "$build" --out "$out/grade" 2>&1 |
      grep -E 'Speed|Beats|TOTAL|NEEDS|FAIL|error'  # a partial test's share shows beside it
    rm -rf "$out/grade/logs" "$out/grade/junit.xml" "$out/grade/results.json"
  else
    echo "skipped: python3 has no PyYAML here"
  fi
fi

say "4. the lab binary ($build/bin/cuda_kernels)"
"$build/bin/cuda_kernels" --set run.out_dir="$out/runs" > "$out/app.log" 2>&1 || status=1
cat "$out/app.log"
run_dir=$(ls -d "$out"/runs/cuda_kernels/*/ 2>/dev/null | tail -1)
if [ -n "$run_dir" ]; then
  for f in summary.json roofline.png bandwidth.png conv_filters.png; do
    [ -f "$run_dir/$f" ] && cp "$run_dir/$f" "$out/"
  done
  rm -rf "$out/runs"  # the rest stays out of $OUT (few files come back from the device machine)
fi
rm -f "$out/tests.json"
say "gpu-check: $([ $status = 0 ] && echo 'all checks passed' || echo 'FAILED (see above)')"
exit $status
