#!/usr/bin/env bash
# Runs the test suite, setting up and building first if needed:
#   scripts/test.sh                 every test (labels: core, lab, gpu, slow)
#   scripts/test.sh -L lab          only the graded lab tests; any ctest arguments work
# GPU tests skip themselves where there is no GPU. Each phase's time is printed as it ends (the
# set-up and build, then every test as ctest finishes it), and at the end the phases and the
# slowest tests, so that a test that grows shows itself (the README gives the suite's budgets).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
started=$SECONDS
bash scripts/setup.sh >&2
built=$SECONDS
echo "[test] set-up and build: $(( (built - started) / 60 )) min $(( (built - started) % 60 )) s" >&2
log=$(mktemp /tmp/amplab-ctest.XXXXXX.log)
set +e
(cd build && ctest --output-on-failure -j "$(nproc)" "$@") 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
tested=$SECONDS
{
  echo "[test] tests: $(( (tested - built) / 60 )) min $(( (tested - built) % 60 )) s; whole command: $(( (tested - started) / 60 )) min $(( (tested - started) % 60 )) s"
  echo "[test] the slowest tests:"
  sed -nE 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([^ ]+) \.+.* ([0-9.]+) sec$/\2 \1/p' "$log" | sort -rn |
    awk 'NR <= 10 {printf "[test]   %7.1f s  %s\n", $1, $2}'
} >&2
rm -f "$log"
exit "$status"
