#!/usr/bin/env bash
# Runs the test suite, setting up and building first if needed:
#   scripts/test.sh                 every test (labels: core, lab, gpu, slow)
#   scripts/test.sh -L lab          only the graded lab tests; any ctest arguments work
# GPU tests skip themselves where there is no GPU.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh >&2
cd build
exec ctest --output-on-failure -j "$(nproc)" "$@"
