#!/usr/bin/env bash
# One-time (and safe to re-run) set-up of a Debian 12 machine for amplab:
#   1. the Debian packages the build needs (compiler, CMake, Ninja, yaml-cpp, spdlog, CLI11,
#      GoogleTest/GoogleMock, zlib, nlohmann-json, Fashion-MNIST), installed only if missing;
#   2. .venv/ with torch==2.11.0 (its LibTorch is what amplab links; the same version as the
#      GPU machines), numpy and matplotlib (plots), pyyaml (rubrics, scripts/grade) and safetensors
#      (weights Python opens: tests/core/safetensors_interop.py), installed only if missing;
#   3. configures and builds build/ (incremental after the first time), with a progress line.
# Without a CUDA toolkit (no nvcc: a laptop, Gradescope), the CUDA compiler comes from pip wheels
# in .venv instead (nvidia-cuda-nvcc, -nvvm, -crt of torch's CUDA version), beside the headers and
# libraries torch's wheel already brings: no GPU and no system toolkit needed.
# Usage: scripts/setup.sh [--no-build] [--target TARGET]...   (default: build everything)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
say() { printf '[setup] %s\n' "$*"; }

targets=()
no_build=0
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) no_build=1 ;;
    --target) targets+=("$2"); shift ;;
    *) echo "[setup] error: unknown argument '$1' (usage: scripts/setup.sh [--no-build] [--target TARGET]...)" >&2; exit 2 ;;
  esac
  shift
done

packages=(g++ cmake ninja-build git python3 python3-venv pkg-config
          libyaml-cpp-dev libspdlog-dev libfmt-dev libgtest-dev libgmock-dev googletest libcli11-dev
          zlib1g-dev nlohmann-json3-dev dataset-fashion-mnist libseccomp-dev bubblewrap util-linux)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  say "installing Debian packages: ${missing[*]}"
  sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "[setup] error: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo=sudo
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -q "${missing[@]}" >/tmp/amplab-apt.log 2>&1 || {
    say "apt-get install failed; updating the package lists and retrying"
    $sudo apt-get update -q >>/tmp/amplab-apt.log 2>&1
    $sudo apt-get install -y -q "${missing[@]}" >>/tmp/amplab-apt.log 2>&1 || {
      echo "[setup] error: apt-get could not install ${missing[*]} (log: /tmp/amplab-apt.log)" >&2; exit 1; }
  }
else
  say "Debian packages: all present"
fi

torch_version=2.11.0
# The CUDA compiler as pip wheels, of the CUDA version of torch 2.11.0+cu130's own CUDA wheels.
cuda_wheels=("nvidia-cuda-nvcc==13.0.88" "nvidia-nvvm==13.0.88" "nvidia-cuda-crt==13.0.88" "nvidia-cuda-cccl==13.0.85")
if [ -x .venv/bin/python ] && .venv/bin/python -c "import torch, numpy, matplotlib, yaml, safetensors, sys; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
  say ".venv: torch $torch_version, numpy, matplotlib, pyyaml, safetensors present"
else
  say "creating .venv with torch==$torch_version, numpy, matplotlib, pyyaml, safetensors (a few GB, a few minutes)"
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q "torch==$torch_version" numpy matplotlib pyyaml safetensors
fi

if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ] && [ -z "${CUDACXX:-}" ]; then
  cu13=$(.venv/bin/python -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))')
  if [ ! -x "$cu13/bin/nvcc" ] || [ ! -x "$cu13/nvvm/bin/cicc" ] || [ ! -f "$cu13/include/crt/host_config.h" ] ||
     [ ! -f "$cu13/include/nv/target" ]; then
    say "no CUDA toolkit here: installing the CUDA compiler's wheels into .venv (about 200 MB; no GPU needed)"
    .venv/bin/python -m pip install -q "${cuda_wheels[@]}"
  fi
  # Lay the wheels out as a toolkit: nvcc links from lib64/, CMake looks for unversioned libraries.
  ln -sfn lib "$cu13/lib64"
  for lib in "$cu13"/lib/lib*.so.*; do
    plain="${lib%%.so.*}.so"
    [ -e "$plain" ] || ln -s "$(basename "$lib")" "$plain"
  done
  say "CUDA compiler: $cu13/bin/nvcc (from pip; cmake/dependencies.cmake finds it there)"
fi

if [ "$no_build" = 1 ]; then exit 0; fi
if [ ! -f build/build.ninja ]; then
  say "configuring build/"
  cmake --preset default >/tmp/amplab-configure.log 2>&1 || { tail -30 /tmp/amplab-configure.log >&2; exit 1; }
fi

# The build, with one progress line (ninja's "[done/total]"): redrawn in place on a terminal, a
# line per tenth of the work otherwise (logs, CI). A file that includes torch costs ~30 s per core.
target_args=()
for t in "${targets[@]}"; do target_args+=(--target "$t"); done
say "building ${targets[*]:-everything} on $(nproc) cores (the first build of everything takes about 25 minutes on 2 cores)"
start=$SECONDS
set +e
cmake --build build -j "$(nproc)" "${target_args[@]}" 2>&1 | tee /tmp/amplab-build.log | {
  shown=-1
  while IFS= read -r line; do
    [[ "$line" =~ ^\[([0-9]+)/([0-9]+)\] ]] || continue
    done_=${BASH_REMATCH[1]} total=${BASH_REMATCH[2]}
    elapsed=$((SECONDS - start))
    progress=$(printf '[setup] building: %d/%d steps, %d min %02d s' "$done_" "$total" $((elapsed / 60)) $((elapsed % 60)))
    if [ -t 2 ]; then
      printf '\r%s' "$progress" >&2
    elif [ $((done_ * 10 / total)) -gt "$shown" ]; then
      shown=$((done_ * 10 / total))
      echo "$progress" >&2
    fi
  done
  [ -t 2 ] && echo >&2
}
status=${PIPESTATUS[0]}
set -e
if [ "$status" != 0 ]; then
  grep -E -A8 'error|FAILED' /tmp/amplab-build.log | head -80 >&2
  echo "[setup] error: the build failed (full log: /tmp/amplab-build.log)" >&2
  exit 1
fi
say "built: build/bin/ in $(( (SECONDS - start) / 60 )) min $(( (SECONDS - start) % 60 )) s"
