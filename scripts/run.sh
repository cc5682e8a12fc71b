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
bash scripts/setup.sh --target "$lab" >&2
exec "build/bin/$lab" "$@"
