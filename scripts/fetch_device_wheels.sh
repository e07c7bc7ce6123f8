#!/usr/bin/env bash
# Download, here (with network), the one wheel scripts/device_check.sh needs on the bare GPU machine (python3.12 +
# torch for CUDA 13 + numpy, no network): NIXL 1.5.1 for CUDA 13, ~56 MB, into .device-wheels/ (git-ignored; carry it
# along, 64 MiB at most). Only the CUDA wheel: its package nixl_cu13 is imported directly (the `nixl` meta
# package would pick it the same way); --no-deps: torch and numpy are the machine's.
#
#   scripts/fetch_device_wheels.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.device-wheels}
mkdir -p "$DIR"
PY=${PY:-python3}
"$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux2014_x86_64 \
    --dest "$DIR" "nixl-cu13==1.5.1"
ls -l "$DIR"
du -sh "$DIR"
