#!/usr/bin/env bash
# One-time (and safe to re-run) set-up of a Debian 12 machine for amplab:
#   1. the Debian packages the build needs (compiler, CMake, Ninja, yaml-cpp, spdlog, CLI11,
#      GoogleTest/GoogleMock, zlib, nlohmann-json, Fashion-MNIST), installed only if missing;
#   2. .venv/ with torch==2.11.0 (its LibTorch is what amplab links; the same version as the
#      GPU machines), numpy and matplotlib (plots) and pyyaml (rubrics, scripts/grade), installed
#      only if missing;
#   3. configures and builds build/ (incremental after the first time).
# Usage: scripts/setup.sh [--no-build]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
say() { printf '[setup] %s\n' "$*"; }

packages=(g++ cmake ninja-build git python3 python3-venv pkg-config
          libyaml-cpp-dev libspdlog-dev libfmt-dev libgtest-dev libgmock-dev googletest libcli11-dev
          zlib1g-dev nlohmann-json3-dev dataset-fashion-mnist)
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

if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "[setup] error: the CUDA toolkit (nvcc) is missing; torch's CMake files need it to build against the" \
       "CUDA wheel (no GPU is needed). Install CUDA 13.0 (e.g. NVIDIA's cuda-toolkit-13-0 package)." >&2
  exit 1
fi

torch_version=2.11.0
if [ -x .venv/bin/python ] && .venv/bin/python -c "import torch, numpy, matplotlib, yaml, sys; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
  say ".venv: torch $torch_version, numpy, matplotlib, pyyaml present"
else
  say "creating .venv with torch==$torch_version, numpy, matplotlib, pyyaml (a few GB, a few minutes)"
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q "torch==$torch_version" numpy matplotlib pyyaml
fi

if [ "${1:-}" = "--no-build" ]; then exit 0; fi
if [ ! -f build/build.ninja ]; then
  say "configuring build/"
  cmake --preset default >/tmp/amplab-configure.log 2>&1 || { tail -30 /tmp/amplab-configure.log >&2; exit 1; }
fi
say "building (the first build takes a while: every file that includes torch costs ~30 s per core)"
if ! cmake --build build -j "$(nproc)" >/tmp/amplab-build.log 2>&1; then
  grep -E -A8 'error|FAILED' /tmp/amplab-build.log | head -80 >&2
  echo "[setup] error: the build failed (full log: /tmp/amplab-build.log)" >&2
  exit 1
fi
say "built: build/bin/"
