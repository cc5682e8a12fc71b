#!/usr/bin/env bash
# Downloads the real MNIST (four IDX .gz files) into data/mnist/, for users with internet.
# Fashion-MNIST, the default dataset, comes from Debian's dataset-fashion-mnist instead.
#
#   scripts/fetch-mnist.sh [DEST]        DEST defaults to data/mnist under the repository
#
# Each file is tried on every mirror in turn and kept only if its MD5 matches the published
# one (torchvision's MNIST resource list). Files already present and verified are skipped, so
# running it again is harmless; a present file with a wrong checksum is downloaded again.
# Environment: MNIST_MIRRORS="url1 url2" replaces the mirror list (e.g. an internal mirror).
# On failure it prints one line saying what failed and exits non-zero.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${1:-$repo_root/data/mnist}"
# shellcheck disable=SC2206  # unquoted on purpose: the variable is a space-separated list
mirrors=(${MNIST_MIRRORS:-https://ossci-datasets.s3.amazonaws.com/mnist/ https://storage.googleapis.com/cvdf-datasets/mnist/})

# file name -> MD5, as published with torchvision.datasets.MNIST
files=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)
declare -A md5=(
  [train-images-idx3-ubyte.gz]=f68b3c2dcbeaaa9fbdd348bbdeb94873
  [train-labels-idx1-ubyte.gz]=d53e105ee54ea40749a09fcbcd1e9432
  [t10k-images-idx3-ubyte.gz]=9fb629c4189551a2d022fa330f9573f3
  [t10k-labels-idx1-ubyte.gz]=ec29112dd5afa0611ce80d1b7f02629c
)

fail() { echo "fetch-mnist: $*" >&2; exit 1; }

md5_of() {  # md5sum (GNU) or md5 (macOS)
  if command -v md5sum >/dev/null; then md5sum "$1" | cut -d' ' -f1; else md5 -q "$1"; fi
}

download() {  # url -> file; fails on HTTP errors, retries transient ones, errors on stderr
  if command -v curl >/dev/null; then
    curl -fsSL --retry 2 --connect-timeout 20 -o "$2" "$1"
  else
    wget -q --tries=3 --timeout=20 -O "$2" "$1"
  fi
}

command -v curl >/dev/null || command -v wget >/dev/null ||
  fail "neither curl nor wget is installed; install one, or copy the four MNIST .gz files into $dest"
command -v md5sum >/dev/null || command -v md5 >/dev/null || fail "no md5sum or md5 command to verify the files"
mkdir -p "$dest" 2>/dev/null || fail "cannot create $dest"

for f in "${files[@]}"; do
  target="$dest/$f"
  if [[ -f "$target" ]]; then
    if [[ "$(md5_of "$target")" == "${md5[$f]}" ]]; then
      echo "$f: present, checksum ok"
      continue
    fi
    # Moved aside, not deleted, and not left where the loaders would pick it up.
    mv -f "$target" "$target.bad"
    echo "$f: present but checksum wrong (moved to $f.bad), downloading again"
  fi
  part="$target.part"  # never leave a half-written file under the real name
  ok='' tried=''
  for m in "${mirrors[@]}"; do
    url="${m%/}/$f"
    if ! err="$(download "$url" "$part" 2>&1)"; then
      err="${err##*$'\n'}"  # curl repeats its error once per retry: keep the last line
      tried+="${tried:+; }$url: ${err:-download failed}"
      continue
    fi
    got="$(md5_of "$part")"
    if [[ "$got" == "${md5[$f]}" ]]; then
      mv -f "$part" "$target"
      echo "$f: downloaded from $url, checksum ok"
      ok=1
      break
    fi
    tried+="${tried:+; }$url: MD5 $got, expected ${md5[$f]}"
  done
  rm -f "$part"
  # One line that says what failed where, and what to do.
  [[ -n "$ok" ]] || fail "no verified $f ($tried); check the internet connection, or copy the file into $dest by hand"
done
echo "MNIST is in $dest (use --dataset mnist / data.dataset: mnist)"
