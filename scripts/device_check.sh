#!/usr/bin/env bash
# The GPU check for a bare machine: one NVIDIA GPU, python3.12 with torch for CUDA 13 (and numpy), no vLLM, no
# network, the NIXL wheel brought along (scripts/fetch_device_wheels.sh puts nixl-cu13 1.5.1, ~56 MB, in
# .device-wheels/). Under 8 minutes, three checks, each a JSON file in $OUT (or ./device-check/), summary.txt
# listing each step's exit status and device_check.json all of them:
#   placement   the placement's CUDA_VISIBLE_DEVICES against `nvidia-smi -L` (scripts/device_check/placement_env.py)
#   tier_mover  the kvtier connector's device <-> pinned host mover, bytes checked, GB/s beside a pinned copy
#   nixl_vram   NIXL READ of KV-shaped VRAM between two processes, bytes checked, GB/s beside a device copy
#   nixl_vram_ucx_defaults  the same READ with UCX's own settings in place of the worker's
#   nixl_vram_write         the same blocks pushed: a WRITE, as push mode moves KV
#
#   scripts/device_check.sh                 # from anywhere; WHEELS=/path/to/wheels to use another directory
set -uo pipefail

cd "$(dirname "$0")/.."
LOG_DIR=${OUT:-$PWD/device-check}
WHEELS=${WHEELS:-$PWD/.device-wheels}
PY=${PY:-python3}
mkdir -p "$LOG_DIR"
SUMMARY=$LOG_DIR/summary.txt
: > "$SUMMARY"
START_S=$SECONDS
FAILED=0

# Seconds per step: together under 8 minutes (480 s), with room for the machine's own start-up.
INSTALL_TIMEOUT_S=${INSTALL_TIMEOUT_S:-60}
PLACEMENT_TIMEOUT_S=${PLACEMENT_TIMEOUT_S:-60}
MOVER_TIMEOUT_S=${MOVER_TIMEOUT_S:-90}
NIXL_TIMEOUT_S=${NIXL_TIMEOUT_S:-120}
NIXL_DEFAULTS_TIMEOUT_S=${NIXL_DEFAULTS_TIMEOUT_S:-70}
NIXL_WRITE_TIMEOUT_S=${NIXL_WRITE_TIMEOUT_S:-70}

log() { echo "[$((SECONDS - START_S))s] $*" | tee -a "$SUMMARY"; }

# step NAME TIMEOUT_S COMMAND...: runs COMMAND with its output in $LOG_DIR/NAME.log, records its exit status.
step() {
    local name=$1 timeout_s=$2
    shift 2
    log "$name: start (timeout ${timeout_s}s)"
    timeout --kill-after=10 "$timeout_s" "$@" > "$LOG_DIR/$name.log" 2>&1
    local rc=$?
    log "$name: rc=$rc"
    if [ "$rc" -ne 0 ]; then
        FAILED=1
        tail -n 40 "$LOG_DIR/$name.log"
    fi
    return "$rc"
}

if ! command -v nvidia-smi > /dev/null 2>&1 || ! nvidia-smi -L > "$LOG_DIR/gpus.txt" 2>&1; then
    log "no NVIDIA GPU here (nvidia-smi missing or failing): this check needs one"
    exit 2
fi
log "gpus: $(tr '\n' ';' < "$LOG_DIR/gpus.txt")"
"$PY" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', \
torch.version.cuda, 'gpu', torch.cuda.is_available() and torch.cuda.get_device_name(0))" >> "$SUMMARY" 2>&1

# NIXL: the wheel unpacked into a directory on PYTHONPATH (a wheel is a zip; no pip, venv or network needed),
# outside $LOG_DIR (~200 MB of libraries are no log) and removed at exit.
SITE=$(mktemp -d /tmp/splitserve-nixl-site.XXXXXX)
trap 'rm -rf "$SITE"' EXIT
install() {
    set -e
    local wheel
    wheel=$(ls "$WHEELS"/nixl_cu13-1.5.1-*.whl 2> /dev/null | head -n 1)
    test -n "$wheel" || { echo "no nixl_cu13-1.5.1 wheel in $WHEELS (scripts/fetch_device_wheels.sh)"; exit 1; }
    rm -rf "$SITE" && mkdir -p "$SITE"
    "$PY" -m zipfile -e "$wheel" "$SITE"
    PYTHONPATH=$SITE "$PY" -c "import numpy, nixl_cu13._api as api; a = api.nixl_agent('probe', \
api.nixl_agent_config(enable_prog_thread=False, backends=[])); a.create_backend('UCX', {}); print('nixl ok')"
}
export -f install
export PY WHEELS SITE
step install "$INSTALL_TIMEOUT_S" bash -c install || log "install failed: the NIXL step cannot run"
export PYTHONPATH=$SITE OMP_NUM_THREADS=1

step placement "$PLACEMENT_TIMEOUT_S" "$PY" scripts/device_check/placement_env.py --timeout-s 45 \
    --out "$LOG_DIR/placement.json"

step tier_mover "$MOVER_TIMEOUT_S" "$PY" scripts/device_check/tier_mover.py --device cuda --layers 36 \
    --num-blocks 512 --move-blocks 64 --repeats 10 --out "$LOG_DIR/tier_mover.json"

step nixl_vram "$NIXL_TIMEOUT_S" "$PY" scripts/device_check/nixl_vram.py --device cuda --layers 36 \
    --num-blocks 256 --read-blocks 64 --repeats 10 --timeout-s 80 --out "$LOG_DIR/nixl_vram.json"

step nixl_vram_ucx_defaults "$NIXL_DEFAULTS_TIMEOUT_S" "$PY" scripts/device_check/nixl_vram.py --device cuda \
    --layers 36 --num-blocks 256 --read-blocks 64 --repeats 10 --timeout-s 40 --ucx defaults \
    --out "$LOG_DIR/nixl_vram_ucx_defaults.json"

step nixl_vram_write "$NIXL_WRITE_TIMEOUT_S" "$PY" scripts/device_check/nixl_vram.py --device cuda \
    --layers 36 --num-blocks 256 --read-blocks 64 --repeats 10 --timeout-s 40 --op WRITE \
    --out "$LOG_DIR/nixl_vram_write.json"

# One JSON of everything, for the README's figures.
"$PY" - "$LOG_DIR" <<'PYEOF' || FAILED=1
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
steps = {}
for name in ("placement", "tier_mover", "nixl_vram", "nixl_vram_ucx_defaults", "nixl_vram_write"):
    path = out / f"{name}.json"
    steps[name] = json.loads(path.read_text()) if path.is_file() else None
summary = (out / "summary.txt").read_text().splitlines()
(out / "device_check.json").write_text(json.dumps({"steps": steps, "summary": summary}, indent=2) + "\n")
print("wrote", out / "device_check.json")
PYEOF

log "done in $((SECONDS - START_S))s; failed=$FAILED; logs in $LOG_DIR"
exit "$FAILED"
