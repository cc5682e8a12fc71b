#!/usr/bin/env bash
# Runs a lab binary, setting up and building first if needed (only that lab's binary and what it
# links: the other labs and the tests are built by scripts/test.sh):
#   scripts/run.sh LAB [ARGS...]        ARGS go to the lab binary
#   scripts/run.sh mnist --set train.epochs=5
# The labs are those with a labs/<lab>/lab.yaml; `scripts/run.sh` alone lists them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
list_labs() { python3 scripts/amplab_labs.py; }  # each labs/<lab>/lab.yaml, in course order
if [ $# -eq 0 ] || [[ "$1" == -* ]]; then
  echo "usage: scripts/run.sh LAB [ARGS...]; the labs:" >&2
  list_labs >&2
  exit 2
fi
lab=$1
shift
if [ ! -f "labs/$lab/lab.yaml" ]; then
  echo "error: no lab '$lab' (no labs/$lab/lab.yaml); the labs:" >&2
  list_labs >&2
  exit 2
fi
ranks=$(python3 scripts/amplab_labs.py --ranks "$lab")  # labs/<lab>/lab.yaml's `ranks` (default 1)
if [ "$ranks" -le 1 ]; then
  bash scripts/setup.sh --target "$lab" >&2
  exec "build/bin/$lab" "$@"
fi
# A lab of several ranks: one per GPU (no more than there are), or CPU ranks on a machine without.
gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU ' || true)
device=()
if [ "$gpus" -eq 0 ]; then
  device=(--set run.device=cpu)
  echo "[run] no GPU here: $ranks CPU ranks (the GPU parts of the lab are skipped)" >&2
elif [ "$gpus" -lt "$ranks" ]; then
  ranks=$gpus
fi
bash scripts/setup.sh --target "$lab" --target amplab-run >&2
exec build/bin/amplab-run --nproc-per-node "$ranks" -- "build/bin/$lab" "${device[@]}" "$@"
