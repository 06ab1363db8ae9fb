#!/usr/bin/env bash
# The wheels scripts/gpu_check.sh installs on a GPU machine that has no package index (Python 3.12, x86-64):
# what such a machine's CUDA image lacked on 2026-12-04 (its torch 2.11 and CUDA libraries are kept).
#   bash scripts/gpu_wheels.sh [DIR]     # default .whl/ (git-ignored); then carry it with the working tree
# bitsandbytes ships one library per CUDA version (125 MB); only CUDA 13.0's and the CPU one are kept
# (GPU_WHEELS_CUDA=130), to fit a 64 MB transfer.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-.whl}"
CUDA="${GPU_WHEELS_CUDA:-130}"
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
PLATFORM=(--platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux2014_x86_64)
get() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
          "${PLATFORM[@]}" -d "$1" "${@:2}"; }
# transformers and what it needs beyond such an image (huggingface-hub 2, kernels, httpx2), and ours
get "$DIR" transformers==5.25.0 huggingface-hub==2.4.0 kernels==0.19.1 httpx2==2.16.2 httpcore2==2.16.2 \
  truststore==0.10.5 tomlkit==0.15.3 click==8.5.1 regex==2026.5.9 pypinyin==0.55.0 plotly==7.1.0 opencc-python-reimplemented==0.1.7
tmp=$(mktemp -d)
get "$tmp" bitsandbytes==0.50.2
(cd "$tmp" && mkdir x && cd x && unzip -q ../bitsandbytes-*.whl \
  && find bitsandbytes -name 'libbitsandbytes_*.so' ! -name "*_cuda${CUDA}.so" ! -name '*_cpu.so' -delete \
  && python3 - <<'PY'
import glob, os
record = glob.glob("bitsandbytes-*.dist-info/RECORD")[0]  # the deleted libraries out of RECORD too
lines = [line for line in open(record) if os.path.exists(line.split(",")[0]) or not line.startswith("bitsandbytes/")]
open(record, "w").writelines(lines)
PY
)
rm -f "$DIR"/bitsandbytes-*.whl
(cd "$tmp/x" && zip -qr "$DIR/$(basename "$tmp"/bitsandbytes-*.whl)" .)
rm -rf "$tmp"
du -sh "$DIR"
