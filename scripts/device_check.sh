#!/usr/bin/env bash
# The CUDA check: on a machine with an NVIDIA GPU, install CUDA vLLM + NIXL into a venv (pinned as `make setup`
# pins them), make the tiny model, run the prefill/decode equality test (KV moved between GPU memories by NIXL,
# kv_buffer_device "cuda") and the raw NIXL READ bench, in under 8 minutes. Logs and the bench JSON go to $OUT
# (or ./device-check/), with summary.txt listing each step's exit status.
#
#   scripts/device_check.sh                     # from the repository root
#   VENV=/opt/venv scripts/device_check.sh      # reuse a venv that already has the packages (skips pip)
#
# Offline machines: point pip at local wheels with its own variables (PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheels).
set -uo pipefail

cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-cuda}
LOG_DIR=${OUT:-$PWD/device-check}
mkdir -p "$LOG_DIR"
SUMMARY=$LOG_DIR/summary.txt
: > "$SUMMARY"
START_S=$SECONDS
FAILED=0

# Seconds per step: together under 8 minutes (480 s), with room for the machine's own start-up.
INSTALL_TIMEOUT_S=${INSTALL_TIMEOUT_S:-210}
MODEL_TIMEOUT_S=${MODEL_TIMEOUT_S:-45}
TEST_TIMEOUT_S=${TEST_TIMEOUT_S:-150}
BENCH_TIMEOUT_S=${BENCH_TIMEOUT_S:-45}

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

PY=$VENV/bin/python
install() {
    set -e
    test -x "$PY" || python3 -m venv "$VENV"
    "$PY" -m pip install -q --upgrade "pip>=24"
    # As the Makefile's setup with ENGINE_EXTRA=cuda: CUDA vLLM of the pinned version, then NIXL 1.5.1 (the cu12
    # wheel carries the libraries; the meta package without its broken pins).
    "$PY" -m pip install -q -e ".[cuda,test]"
    "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2> /dev/null || true
    "$PY" -m pip install -q nixl-cu12==1.5.1
    "$PY" -m pip install -q --no-deps nixl==1.5.1
    "$PY" -c "import torch, vllm, nixl; assert torch.cuda.is_available(), 'torch sees no GPU'; print('torch', torch.__version__, 'vllm', vllm.__version__)"
}
if [ -x "$PY" ] && "$PY" -c "import torch, vllm, nixl; assert torch.cuda.is_available()" > /dev/null 2>&1; then
    log "install: $VENV already has torch (CUDA), vllm and nixl"
else
    export -f install
    export PY VENV
    step install "$INSTALL_TIMEOUT_S" bash -c install || { log "install failed: nothing else can run"; exit 1; }
fi

export PYTHONPATH=$PWD OMP_NUM_THREADS=1
"$PY" -c "import torch, vllm; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'vllm', vllm.__version__)" \
    >> "$SUMMARY" 2>&1

step model "$MODEL_TIMEOUT_S" "$PY" -m cli.main model make-tiny --out models/tiny || { log "no model: stopping"; exit 1; }

# Prefill and decode vLLM engines in separate worker processes, KV pulled with NIXL, greedy fp32 output equal to
# one engine's through the HTTP API (tests/e2e/test_vllm_disagg.py).
step pd_equality "$TEST_TIMEOUT_S" "$PY" -m pytest -q -p no:cacheprovider -m vllm tests/e2e/test_vllm_disagg.py

# Raw NIXL READ between two processes, shaped like the tiny model's KV for a 512-token prompt.
step nixl_read "$BENCH_TIMEOUT_S" "$PY" bench/nixl_read.py --model models/tiny --dtype float32 \
    --prompt-tokens 512 --repeats 10 --out "$LOG_DIR/nixl_read.json"

log "done in $((SECONDS - START_S))s; failed=$FAILED; logs in $LOG_DIR"
exit "$FAILED"
