#!/usr/bin/env bash
# Runs a lab binary, setting up and building first if needed (only that lab's binary and what it
# links: the other labs and the tests are built by scripts/test.sh):
#   scripts/run.sh [LAB] [ARGS...]      LAB defaults to mnist; ARGS go to the lab binary
#   scripts/run.sh mnist --set train.epochs=5
# Labs: gpu_basics, amp_training, memory_optimization, mnist, ddp, cuda_kernels, transformer_fp8
# (see labs/<lab>/README.md).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
lab=mnist
if [ $# -gt 0 ] && [[ "$1" != -* ]]; then lab=$1; shift; fi
if [ ! -d "labs/$lab" ]; then
  echo "error: no lab '$lab'; labs: $(ls labs | tr '\n' ' ')" >&2
  exit 2
fi
bash scripts/setup.sh --target "$lab" >&2
exec "build/bin/$lab" "$@"
