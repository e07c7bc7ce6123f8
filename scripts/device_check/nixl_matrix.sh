#!/usr/bin/env bash
# Why a NIXL READ of VRAM runs at the speed it does: the device check's READ (nixl_vram.py) under several
# settings, one JSON each in $OUT/nixl_matrix/ (or ./device-check/nixl_matrix/), all in nixl_matrix.json, and
# UCX's own account of the protocol it chose (UCX_PROTO_INFO) in the logs. Needs what device_check.sh needs,
# with the NIXL wheel already unpacked on PYTHONPATH. About 15 s a case on an H200.
#
#   case                what changes from the worker's settings
#   worker              READ of scattered blocks, one descriptor per layer-block; target progresses every 1 ms
#   get_auto            UCX_CUDA_IPC_ENABLE_GET_ZCOPY=auto (UCX's own rule: GET only with NVLink), as before
#   write               the same blocks WRITTEN (push) instead of READ
#   write_contiguous    a WRITE of one run of blocks per layer
#   target_busy         the target progresses in a busy loop (a progress thread with no delay)
#   contiguous          one run of blocks per layer: one descriptor per layer
#   contiguous_busy     both
#   ipc_only            UCX_TLS=cuda_ipc,cuda_copy,self: no host-memory or TCP transports at all
#   host_staged         UCX_TLS=cuda_copy,sm,self,tcp: no cuda_ipc (staged through host memory)
#   one_descriptor      one layer, 256 blocks of 1 MiB in one run: a single 256 MiB descriptor
set -uo pipefail
cd "$(dirname "$0")/../.."
LOG_DIR=${OUT:-$PWD/device-check}/nixl_matrix
PY=${PY:-python3}
CASE_TIMEOUT_S=${CASE_TIMEOUT_S:-90}
mkdir -p "$LOG_DIR"
BASE=(--device cuda --layers 36 --num-blocks 256 --read-blocks 64 --repeats 5 --timeout-s 60)

# one NAME ENV_ASSIGNMENTS... -- ARGS...
one() {
    local name=$1
    shift
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    env UCX_PROTO_INFO=y "${envs[@]}" timeout --kill-after=5 "$CASE_TIMEOUT_S" "$PY" \
        scripts/device_check/nixl_vram.py "$@" --out "$LOG_DIR/$name.json" > "$LOG_DIR/$name.log" 2>&1
    echo "$name: rc=$? $(grep -o '"xfer_gbps_median": [0-9.]*' "$LOG_DIR/$name.json" 2> /dev/null)"
}

one worker -- "${BASE[@]}"
one get_auto UCX_CUDA_IPC_ENABLE_GET_ZCOPY=auto -- "${BASE[@]}"
one write -- "${BASE[@]}" --op WRITE
one write_contiguous -- "${BASE[@]}" --op WRITE --contiguous
one target_busy -- "${BASE[@]}" --target-poll-s 0
one contiguous -- "${BASE[@]}" --contiguous
one contiguous_busy -- "${BASE[@]}" --contiguous --target-poll-s 0
one ipc_only UCX_TLS=cuda_ipc,cuda_copy,self -- "${BASE[@]}"
one host_staged UCX_TLS=cuda_copy,sm,self,tcp -- "${BASE[@]}"
one one_descriptor -- --device cuda --layers 1 --num-blocks 512 --block-bytes 1048576 --read-blocks 256 \
    --repeats 5 --timeout-s 60 --contiguous

"$PY" - "$LOG_DIR" <<'PYEOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
cases = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json")) if p.stem != "nixl_matrix"}
(out / "nixl_matrix.json").write_text(json.dumps(cases, indent=2) + "\n")
print("wrote", out / "nixl_matrix.json")
PYEOF
