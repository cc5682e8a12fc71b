#!/usr/bin/env bash
# Every performance row of the course beside its best PyTorch setup, on this machine's GPUs, in one
# command, then one table of ratios with the machine it ran on (bench/lead.py). Run after a build:
#
#   bench/lead.sh [OUT_DIR]        (default: runs/lead-<date>-<time>)
#
# Each row runs its C++ side, then its PyTorch side, ROUNDS times over (C++, Python, C++, Python),
# every run a fresh process whose log and results go under OUT_DIR/<row>/. The table takes each
# side's median over the rounds, and the best of the PyTorch setups (OUT_DIR/table.md, lead.json).
# The rows, with what each costs on 4 x H100 (estimates, not yet timed):
#   mnist    the MNIST lab's gpu-amp bf16 mode (CUDA graph), 2 epochs, the second timed, against
#            bench/mnist_reference.py on resident data with a CUDA graph and the lab run's optimizer
#            and schedule (bench/side_by_side.py --reference-flags). About 25 s a round.
#   gpt      the GPT lab binary's bf16 row (the fast path: fused residual steps, CUDA-graph steps) over GPT_STEPS steps, against
#            bench/gpt_reference.py under torch.compile, mode reduce-overhead every round and mode
#            default in the first (about 1.7x slower, never the best). About 2 minutes for the
#            first round (compiling), 40 s for each after (inductor's cache).
#   fp8_mlp  that binary's FP8 MLP table (study.rows=[]: no GPT trained; its cast and matmul tables
#            come with it; the fastest of its FP8 rows counts: with train.fast_path, the fast path's
#            FP8 MLP beside the lab's fp8_linear) against bench/fp8_mlp_reference.py: bf16 eager and compiled, torchao's
#            Float8Linear tensorwise and rowwise, compiled. About 95 s, then 60 s a round.
#   ddp      the lab's MLP bench, its reference setting (fp32 gradients), under amplab-run on 2 and
#            4 GPUs, against bench/ddp_reference.py under torchrun with bucket_cap_mb DDP_BUCKETS,
#            each with and without static_graph; both time the MLP alone in the same processes
#            first (scaling efficiency = alone / under DDP). About 45 s per world size a round.
# About 9 minutes in all with the defaults (DEADLINE_S keeps it inside 10), about 5-6 with QUICK=1.
#
# Environment: BIN (default build/bin), PYTHON (python3), ROWS (default "mnist gpt fp8_mlp ddp"),
# ROUNDS (2), QUICK=1 (1 round), GPT_STEPS (1000; the GPT target counts 1000 or more), DDP_STEPS
# (20 timed steps), DDP_BUCKETS (25,100,268), SHAKESPEARE_DIR (data/shakespeare), RUN_TIMEOUT
# (240 s a run), DEADLINE_S (540: no run starts within 30 s of it and none runs past it, so that
# the table comes inside a 10-minute limit; the runs not started say so). Relative paths are the
# caller's; the defaults are the project's. An existing OUT_DIR keeps the rows ROWS leaves out:
# ROWS=gpt bench/lead.sh DIR runs that row again and prints the whole table.
# A row that cannot run here (no GPU, fewer GPUs than a world size, no FP8 matmul, no build, no
# text) is in the table as "skipped: <why>"; without a GPU every row is, within seconds.
# torchao: when PYTHON cannot import it and .whl/ holds a torchao wheel, it is installed into
# $TMPDIR/lead-site for this command (PYTHONPATH). Every run has NCCL_NVLS_ENABLE=0,
# TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 (NVLink multicast off).
# Exit status: 0 when every run that started gave its result, 1 when one did not (the table still
# comes, naming its log), 2 on a bad setting.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
python="${PYTHON:-python3}"
bin="${BIN:-$root/build/bin}"
quick="${QUICK:-0}"
rounds="${ROUNDS:-$([[ "$quick" == 1 ]] && echo 1 || echo 2)}"
gpt_steps="${GPT_STEPS:-1000}"
ddp_steps="${DDP_STEPS:-20}"
ddp_buckets="${DDP_BUCKETS:-25,100,268}"
rows="${ROWS:-mnist gpt fp8_mlp ddp}"
text="${SHAKESPEARE_DIR:-$root/data/shakespeare}"
run_timeout="${RUN_TIMEOUT:-240}"
deadline="${DEADLINE_S:-540}"
min_run_s=30
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

log() { echo "lead: $*" >&2; }
die() { log "$*"; exit 2; }

for row in $rows; do
  case "$row" in mnist | gpt | fp8_mlp | ddp) ;; *) die "ROWS: no row '$row' (the rows: mnist gpt fp8_mlp ddp)" ;; esac
done
for n in "$rounds" "$gpt_steps" "$ddp_steps" "$run_timeout" "$deadline"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "ROUNDS, GPT_STEPS, DDP_STEPS, RUN_TIMEOUT and DEADLINE_S are whole numbers above 0 (got '$n')"
done

# Paths the caller gave relative to where it stands; the runs start in the project root.
out="${1:-runs/lead-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
[[ "$bin" == /* ]] || bin="$PWD/$bin"
[[ "$text" == /* ]] || text="$PWD/$text"
[[ "$python" != */* || "$python" == /* ]] || python="$PWD/$python"
cd "$root"

# skip DIR REASON [FILE]: the row (FILE: one world size of it) does not run here; the table says why.
skip() {
  echo "$2" >"$1/${3:-skipped}"
  log "$(basename "$1")${3:+ ${3#skipped-}}: skipped: $2"
}

# run LOG COMMAND...: one run in a fresh process, its output into LOG, within RUN_TIMEOUT and the
# time left before DEADLINE_S; none starts with less than min_run_s left (its log says so instead).
# Non-zero when it did not finish well.
run() {
  local log="$1" left=$((deadline - SECONDS)) rc=0
  shift
  if ((left < min_run_s)); then
    echo "lead: skipped: out of time (DEADLINE_S=$deadline)" >"$log"
    log "${log#"$out"/}: not started, out of time"
    return 1
  fi
  local limit=$((left < run_timeout ? left : run_timeout))
  log "${SECONDS}s: ${log#"$out"/}"
  timeout -k 10 "$limit" "$@" >"$log" 2>&1 || rc=$?
  if ((rc != 0)); then
    local why="exit $rc"
    ((rc != 124)) || why="killed after $limit s"
    log "${log#"$out"/} failed ($why); its last lines:"
    tail -n 3 "$log" | sed 's/^/    /' >&2
  fi
  return "$rc"
}

# What a row needs: each check that fails records the skip and returns 1.
need() {
  local dir="$1" why="$2"
  shift 2
  "$@" && return 0
  skip "$dir" "$why"
  return 1
}
need_gpu() { need "$1" "no CUDA GPU visible to $python" test "$gpus" -gt 0; }
need_bin() { need "$1" "no $bin/$2: build first (scripts/setup.sh, or cmake --build)" test -x "$bin/$2"; }
need_fp8() { need "$1" "no FP8 matmul on this GPU (compute capability $capability, needs 8.9+)" test "$fp8" = 1; }
need_text() { need "$1" "no $text/train.txt: run scripts/fetch-shakespeare.py" test -f "$text/train.txt"; }

# A row's folder, emptied of an earlier run's files.
fresh() { rm -rf "$1" && mkdir -p "$1"; }

row_mnist() {
  local dir="$out/mnist" r summary flags=()
  fresh "$dir"
  need_gpu "$dir" && need_bin "$dir" mnist || return 0
  for ((r = 1; r <= rounds; r++)); do
    run "$dir/cpp-$r.log" "$bin/mnist" --config configs/mnist.yaml --set 'mnist.modes=[gpu-amp]' \
      --set 'mnist.amp_precisions=[bf16-mixed]' --set train.epochs=2 --set mnist.plots=false \
      --set mnist.profile_steps=0 --set run.out_dir="$dir/cpp-$r" || true
    # The Python runs train as the lab did: its resolved config -> mnist_reference.py flags.
    if ((${#flags[@]} == 0)); then
      summary=$(find "$dir" -path "$dir/cpp-*/*/*/summary.json" -print -quit)
      [[ -z "$summary" ]] || read -ra flags <<<"$("$python" bench/side_by_side.py --reference-flags "$summary" || true)"
    fi
    if ((${#flags[@]} == 0)); then
      echo "lead: skipped: no lab run to take the optimizer and schedule from" >"$dir/py-$r.log"
      continue
    fi
    run "$dir/py-$r.log" "$python" bench/mnist_reference.py --device cuda --precision bf16-mixed --cuda-graph \
      --epochs 2 "${flags[@]}" --json "$dir/py-$r.json" || true
  done
}

row_gpt() {
  local dir="$out/gpt" r mode modes
  fresh "$dir"
  need_gpu "$dir" && need_bin "$dir" transformer_fp8 && need_text "$dir" || return 0
  for ((r = 1; r <= rounds; r++)); do
    run "$dir/cpp-$r.log" "$bin/transformer_fp8" --config configs/transformer_fp8.yaml --set data.dir="$text" \
      --set 'study.rows=[bf16]' --set study.steps="$gpt_steps" --set study.eval_every="$gpt_steps" \
      --set study.attention_study=false --set study.fp8_mlp=false --set study.sample_tokens=0 \
      --set study.plots=false --set run.out_dir="$dir/cpp-$r" || true
    modes="reduce-overhead"
    if ((r == 1)); then modes+=" default"; fi
    for mode in $modes; do
      run "$dir/py-$mode-$r.log" "$python" bench/gpt_reference.py --data "$text" --rows "" --compile \
        --compile-mode "$mode" --steps "$gpt_steps" --eval-every "$gpt_steps" --json "$dir/py-$mode-$r.json" || true
    done
  done
}

row_fp8_mlp() {
  local dir="$out/fp8_mlp" r
  fresh "$dir"
  need_gpu "$dir" && need_fp8 "$dir" && need_bin "$dir" transformer_fp8 && need_text "$dir" || return 0
  for ((r = 1; r <= rounds; r++)); do
    run "$dir/cpp-$r.log" "$bin/transformer_fp8" --config configs/transformer_fp8.yaml --set data.dir="$text" \
      --set 'study.rows=[]' --set study.attention_study=false --set study.fp8_mlp=true --set study.sample_tokens=0 \
      --set study.plots=false --set run.out_dir="$dir/cpp-$r" || true
    run "$dir/py-$r.log" "$python" bench/fp8_mlp_reference.py --json "$dir/py-$r.json" || true
  done
}

row_ddp() {
  local dir="$out/ddp" world r
  fresh "$dir"
  need_gpu "$dir" && need_bin "$dir" ddp && need_bin "$dir" amplab-run || return 0
  for world in 2 4; do
    if ((gpus < world)); then
      skip "$dir" "needs $world GPUs, $gpus here" "skipped-w$world"
      continue
    fi
    for ((r = 1; r <= rounds; r++)); do
      run "$dir/cpp-w$world-$r.log" "$bin/amplab-run" --nproc-per-node "$world" -- "$bin/ddp" --config configs/ddp.yaml \
        --set bench.enabled=true --set 'bench.settings=[bucketed_fast]' --set 'bench.bucket_sweep_mb=[]' --set bench.steps="$ddp_steps" \
        --set run.out_dir="$dir/cpp-w$world-$r" || true
      run "$dir/py-w$world-$r.log" "$python" -m torch.distributed.run --standalone --nproc-per-node "$world" \
        bench/ddp_reference.py --alone-first --steps "$ddp_steps" --bucket-cap-mb "$ddp_buckets" --static-graph both \
        --json "$dir/py-w$world-$r.json" || true
    done
  done
}

# torchao from .whl/ when PYTHON lacks it (the GPU machine has no package index).
ensure_torchao() {
  local site="${TMPDIR:-/tmp}/lead-site" wheels=(.whl/torchao-*.whl)
  [[ -e "${wheels[0]}" ]] || return 0
  if "$python" -c 'import torchao' 2>/dev/null; then return 0; fi
  if [[ ! -d "$site/torchao" ]]; then
    "$python" -m pip install -q --no-index --no-deps --target "$site" "${wheels[@]}" >&2 ||
      { log "could not install ${wheels[*]}; the torchao setups will say so"; return 0; }
  fi
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  log "torchao from ${wheels[*]} (in $site)"
}

# The machine into OUT_DIR/machine.json; GPUs, FP8 (0/1) and compute capability for the checks.
probe() {
  read -r gpus fp8 capability < <("$python" bench/lead.py --probe "$out") || true
  [[ "${gpus:-}" =~ ^[0-9]+$ ]] || { log "cannot read the machine with $python (bench/lead.py --probe $out)"; exit 1; }
}

probe
if ((gpus > 0)) && [[ " $rows " == *" fp8_mlp "* ]]; then
  ensure_torchao
  probe  # machine.json with torchao's version
fi
log "$gpus GPU(s), FP8 $([[ "$fp8" == 1 ]] && echo yes || echo no); rows: $rows; $rounds round(s); into $out"
for row in $rows; do
  "row_$row"
done
log "${SECONDS}s: the table"
"$python" bench/lead.py "$out"
