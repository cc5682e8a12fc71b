#!/usr/bin/env bash
# Runs the Python reference matrix behind the reference numbers the labs' READMEs quote (the MNIST CNN
# rows): one fresh process per variant, so no run inherits another's caches, warm GPU or
# compiled code. Writes NN-<name>.json and NN-<name>.log per run into OUT_DIR, then
# summary.json (all runs in one file) and a table on stdout.
#
#   bench/run_reference.sh OUT_DIR [--cpu-only] [--skip-cpu] [--skip-compile] [--extra] [-- ARGS...]
#
#   --cpu-only      only the CPU row (what a machine without a GPU can run)
#   --skip-cpu      leave the CPU row out (the slowest one)
#   --skip-compile  leave the torch.compile row out (its first epoch compiles for ~a minute)
#   --extra         also tf32 resident, fp32 graph, and a tuned bf16 graph (fused SGD, cuDNN
#                   benchmark, channels_last): candidates for the best Python figure
#   -- ARGS         passed to every run, e.g. -- --limit 2000 for a smoke test
# Environment: PYTHON (default python3), EPOCHS (GPU runs, default 2: a cold and a warm epoch),
# CPU_EPOCHS (default 1), RUN_TIMEOUT (seconds per run, default 240).
# About 2-3 minutes on one H200 with the defaults. Exit status: non-zero if any run failed.
set -uo pipefail

usage() { sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

out_dir="" cpu_only="" skip_cpu="" skip_compile="" extra="" pass=()
while (($#)); do
  case "$1" in
    --cpu-only) cpu_only=1 ;;
    --skip-cpu) skip_cpu=1 ;;
    --skip-compile) skip_compile=1 ;;
    --extra) extra=1 ;;
    --) shift; pass=("$@"); break ;;
    -h|--help) usage ;;
    -*) echo "run_reference: unknown option $1" >&2; usage ;;
    *) [[ -z "$out_dir" ]] || usage; out_dir="$1" ;;
  esac
  shift
done
[[ -n "$out_dir" ]] || usage

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
epochs="${EPOCHS:-2}"
cpu_epochs="${CPU_EPOCHS:-1}"
run_timeout="${RUN_TIMEOUT:-240}"
mkdir -p "$out_dir" || { echo "run_reference: cannot create $out_dir" >&2; exit 1; }

if [[ -z "$cpu_only" ]] && ! "$python" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
  echo "run_reference: no CUDA device visible to $python; run on a GPU machine, or pass --cpu-only" >&2
  exit 1
fi

failed=0
# run NAME ARGS...: one variant, its log next to its JSON; a failure is recorded as a JSON too,
# so the table shows it.
run() {
  local name="$1"; shift
  local json="$out_dir/$name.json" log="$out_dir/$name.log"
  rm -f "$json"
  echo "== $name: $*" >&2
  timeout "$run_timeout" "$python" "$here/mnist_reference.py" "$@" "${pass[@]}" --json "$json" 2>&1 | tee "$log" >&2
  local rc=${PIPESTATUS[0]}
  if ((rc != 0)); then
    failed=1
    ((rc == 124)) && echo "(killed after ${run_timeout} s)" >>"$log"
    printf '{"benchmark": "mnist_reference", "status": "failed", "variant": "%s", "exit_code": %d, "log": "%s"}\n' \
      "$name" "$rc" "$log" >"$json"
  fi
}

gpu=(--device cuda --epochs "$epochs")
if [[ -z "$skip_cpu" ]]; then
  run 01-cpu-fp32-dataloader --device cpu --precision fp32 --loader dataloader --epochs "$cpu_epochs"
fi
if [[ -z "$cpu_only" ]]; then
  run 02-cuda-fp32-dataloader "${gpu[@]}" --precision fp32 --loader dataloader
  run 03-cuda-fp16-dataloader "${gpu[@]}" --precision fp16-mixed --loader dataloader
  run 04-cuda-fp32-resident "${gpu[@]}" --precision fp32 --loader resident
  run 05-cuda-fp16-resident "${gpu[@]}" --precision fp16-mixed --loader resident
  run 06-cuda-bf16-resident "${gpu[@]}" --precision bf16-mixed --loader resident
  run 07-cuda-bf16-graph "${gpu[@]}" --precision bf16-mixed --cuda-graph
  if [[ -z "$skip_compile" ]]; then
    run 08-cuda-bf16-compile "${gpu[@]}" --precision bf16-mixed --loader resident --compile
  fi
  if [[ -n "$extra" ]]; then
    run 09-cuda-tf32-resident "${gpu[@]}" --precision tf32 --loader resident
    run 10-cuda-fp32-graph "${gpu[@]}" --precision fp32 --cuda-graph
    run 11-cuda-bf16-graph-tuned "${gpu[@]}" --precision bf16-mixed --cuda-graph --fused-sgd --cudnn-benchmark \
      --channels-last
  fi
fi

"$python" "$here/reference_table.py" "$out_dir" || failed=1
exit "$failed"
