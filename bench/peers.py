"""splitserve against vLLM's own P/D (and aggregated vLLM) on the same engines, model, cores and load (issue 29).

Arms (bench/peers_arms.py), interleaved A B A B in one run: splitserve P/D (`up` defaults, and every prompt
prefilled remotely), vLLM's own P/D through vllm-router (set like splitserve's engines, and as shipped), two
aggregated vLLM engines behind vllm-router (cache_aware), splitserve aggregated. Each arm is started, loaded at
every rate of the sweep with the same open-loop Poisson workload (`splitserve bench`'s runner, /v1/completions
with token-id prompts, ISL and OSL distributions, greedy, ignore_eos), and stopped.

The rates (``--rates``): below and at the prefill limit. The first P/D arm measures the prefill engine alone
first (prompts of the mean ISL with max_tokens 1, ``--limit-concurrency`` at a time: its prompt tokens/s over the
mean ISL, in the JSON as ``prefill_limit``). That is an upper bound: with decode streams, the frontend, the router
and the client sharing the 2 cores, the graph saturated at about a quarter of it here (2,049 prompt tokens/s alone
= 1.88 req/s; at 0.94 req/s TTFT p50 was 5 s in both systems), so the default rates are the measured region,
0.25 and 0.45 req/s; ``--rate-fractions`` instead scales the measured limit.

Per point: goodput under the SLOs, TTFT/ITL/TPOT percentiles (bench/lib/metrics.py), and CPU seconds of every
process of the system (/proc/<pid>/stat before and after: the frontend, the router, each worker and its vLLM
EngineCore and model processes), per request and per output token. ``--profile-s N`` also samples every process
with py-spy (`record --native`, raw collapsed stacks under --log-dir) during the first point of each arm; a
profiled point is marked and perturbed by the sampling (compare unprofiled runs).

The serving layer alone against NVIDIA Dynamo (zero-delay mocks): ``--suite serving-layer``
(bench/peers_serving.py).

    python -m bench.peers [--order ss-pd,vllm-pd,ss-pd,vllm-pd] [--rates 0.2,0.4 | --find-limit]
        [--num-requests 20] [--isl uniform:128:2048] [--osl 96] [--out bench/results/peers.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from bench.lib.bench import BenchConfig, run_bench
from bench.lib.load import run_load_sync
from bench.lib.machine import loadavg
from bench.lib.metrics import parse_slo
from bench.lib.procs import tree_pids
from bench.lib.results import MODEL_100M, RESULTS, conditions, finish, require_model, write_result
from bench.lib.workloads import Dist, WorkloadSpec
from bench.peers_arms import ARMS, DECODE_CORE, PREFILL_CORE, Running, process_cpu, start_arm
from bench.peers_report import plot, summarize
from cli.graph_spec import UP_KV_TRANSFER
from services.worker.engines.vllm.dtype import cpu_has_fast_bf16

SLO = "ttft_ms=3000,itl_ms=60"


def find_limit(running: Running, model: str, isl: int, concurrency: int, num: int) -> dict[str, Any]:
    """Prompt tokens/s the P/D graph prefills when prompts queue (max_tokens 1), and requests/s at ``isl``."""
    import random

    rng = random.Random(7)
    bodies = [{"model": model, "prompt": [rng.randrange(100, 8000) for _ in range(isl)], "max_tokens": 1,
               "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}} for _ in range(num)]
    run_load_sync(running.url, "/v1/completions", bodies[:1], 1)  # warm-up: the NIXL handshake
    res = run_load_sync(running.url, "/v1/completions", bodies[1:], concurrency)
    tokens_per_s = isl * res.num_ok / res.wall_s if res.wall_s > 0 else 0.0
    return {"isl": isl, "concurrency": concurrency, "num_prompts": num - 1, "num_ok": res.num_ok,
            "wall_s": round(res.wall_s, 2), "prompt_tokens_per_s": round(tokens_per_s, 1),
            "requests_per_s_at_mean_isl": round(tokens_per_s / isl, 3)}


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("--profile-s needs py-spy (pip install py-spy)")
    return found


def profile(pids: dict[str, int], seconds: float, log_dir: Path, tag: str) -> list[subprocess.Popen[bytes]]:
    """py-spy record --native of every process of the system (raw collapsed stacks), on the prefill core."""
    procs = []
    for label, top in pids.items():
        for pid in tree_pids(top):
            out = log_dir / f"pyspy-{tag}-{label}-{pid}.txt"
            procs.append(subprocess.Popen(
                ["taskset", "-c", str(PREFILL_CORE), _py_spy(), "record", "--pid", str(pid), "--native", "--rate",
                 "100", "--duration", str(int(seconds)), "--format", "raw", "--output", str(out)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return procs


def run_point(args: argparse.Namespace, running: Running, arm_name: str, index: int, rate: float, pd: bool,
              profiled: bool) -> dict[str, Any]:
    """One load point: open loop at ``rate`` requests/s, or closed loop at --concurrency (``rate`` then 0)."""
    spec = workload_spec(args)
    load = {"concurrency": [args.concurrency]} if args.concurrency else {"rate": [rate]}
    cfg = BenchConfig(url=running.url, endpoint="completions", workload=spec, **load,
                      num_requests=args.num_requests, max_duration_s=args.max_duration_s, timeout_s=args.timeout_s,
                      # Every arm gets the same arrivals and prompts at a rate (each arm starts on fresh engines).
                      slo=parse_slo(args.slo), seed=args.seed, warm_prefixes=args.warm_prefixes, prompt_salt=args.seed * 1000 + round(rate * 1000),
                      output=Path(args.log_dir) / f"peers-{index}-{arm_name}-{rate:g}", label=arm_name,
                      conditions={"pd": "1:1" if pd else "0:2 (aggregated)", "arm": arm_name}, progress=False,
                      plots=False, argv=["python", "-m", "bench.peers"])
    spies = profile(running.pids, args.profile_s, Path(args.log_dir), f"{index}-{arm_name}") if profiled else []
    cpu0, t0, load0 = process_cpu(running.pids), time.monotonic(), loadavg()
    doc = run_bench(cfg, echo=lambda _line: None)
    cpu1, wall = process_cpu(running.pids), time.monotonic() - t0
    for spy in spies:
        spy.wait()
    point = doc["points"][0]
    r = point["results"]
    rows = orjson.loads((Path(cfg.output) / "point-0.json").read_bytes())["requests"] if args.also_slo else []
    by_slo = {text: goodput(rows, parse_slo(text), r["duration_s"]) for text in args.also_slo}
    num_ok = max(1, r["num_ok"])
    num_tokens = r["output_tokens"] or None
    cpu = {k: round(cpu1.get(k, 0.0) - cpu0.get(k, 0.0), 3) for k in sorted(set(cpu0) | set(cpu1))}
    return {"rate": rate, "wall_s": round(wall, 1), "loadavg_before_after": [load0, loadavg()], "profiled": profiled,
            "results": r, "server_metrics": point.get("server_metrics"), "goodput_by_slo": by_slo,
            "cpu_s": cpu, "cpu_ms_per_request": {k: round(v * 1e3 / num_ok, 2) for k, v in cpu.items()},
            "cpu_ms_per_output_token": ({k: round(v * 1e3 / num_tokens, 3) for k, v in cpu.items()}
                                        if num_tokens else None),
            "bench_output": str(cfg.output)}


# The SLO keys' per-request fields in a point file's request rows (bench/lib/bench.py request_rows).
ROW_FIELDS = {"ttft_ms": "ttft_ms", "itl_ms": "itl_max_ms", "tpot_ms": "tpot_ms", "e2e_ms": "e2e_ms"}


def goodput(rows: list[dict[str, Any]], slo: dict[str, float], duration_s: float) -> float | None:
    """Requests/s that succeeded within every bound of ``slo``, as bench/lib/metrics.py's goodput counts them
    (a value the request has none of, e.g. the ITL of a one-token answer, does not fail it)."""
    if not duration_s:
        return None
    met = sum(1 for row in rows if row["ok"] and all(row.get(ROW_FIELDS[k]) is None or row[ROW_FIELDS[k]] <= bound
                                                     for k, bound in slo.items()))
    return round(met / duration_s, 4)


def workload_spec(args: argparse.Namespace) -> WorkloadSpec:
    """--workload: synthetic (unique prompts of --isl), long-mix (--long-fraction of --long-isl among --isl),
    shared-prefix (--num-prefixes of --prefix-len + --suffix-len), multi-turn (--turns, history grows)."""
    return WorkloadSpec(kind=args.workload, isl=args.isl, osl=args.osl, long_isl=args.long_isl,
                        long_fraction=args.long_fraction, num_prefixes=args.num_prefixes, prefix_len=args.prefix_len,
                        suffix_len=args.suffix_len, turns=args.turns, think_time_s=args.think_time_s)


def run_arm(args: argparse.Namespace, arm_name: str, index: int, rates: list[float] | None) -> dict[str, Any]:
    arm = ARMS[arm_name]
    out: dict[str, Any] = {"arm": arm_name, "index": index, "what": arm.what, "system": arm.system,
                           "loadavg_before": loadavg(), "uptime": _uptime()}
    all_cores = os.sched_getaffinity(0)
    running = start_arm(arm, args.model, args.dtype, Path(args.log_dir), args.kv_transfer, index, args.num_blocks,
                        args.server_log_level)
    try:
        out.update(running.facts)
        out["pids"] = running.pids
        # The load generator stands in for remote users: where the control plane runs (P/D: the prefill core).
        client_cores = {PREFILL_CORE} if arm.pd else all_cores
        os.sched_setaffinity(0, client_cores)
        out["client_cores"] = sorted(client_cores)
        if args.concurrency:
            rates = [0.0]
        elif arm.pd and not args.limit_measured and not args.skip_limit:
            args.limit_measured = True
            out["prefill_limit"] = find_limit(running, args.model.resolve().name, round(Dist.parse(args.isl).mean()),
                                              args.limit_concurrency, args.limit_prompts)
            if rates is None:
                limit = out["prefill_limit"]["requests_per_s_at_mean_isl"]
                rates = [round(limit * f, 3) for f in args.rate_fractions]
                out["rates_from_limit"] = rates
        out["points"] = [run_point(args, running, arm_name, index, rate, arm.pd, args.profile_s > 0 and i == 0)
                         for i, rate in enumerate(rates)]
    finally:
        os.sched_setaffinity(0, all_cores)
        running.stop()
        out["loadavg_after"] = loadavg()
    return out


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=MODEL_100M)
    ap.add_argument("--dtype", default=None, help="default: bfloat16 where the CPU has native bf16, else float32")
    ap.add_argument("--order", default="ss-pd,vllm-pd,ss-pd,vllm-pd",
                    help=f"arms, run in this order (A B A B): {', '.join(ARMS)}")
    ap.add_argument("--rates", default="0.25,0.45", help="requests/s, comma-separated")
    ap.add_argument("--rate-fractions", default="", help="instead of --rates: fractions of the measured prefill limit")
    ap.add_argument("--skip-limit", action="store_true", help="with --rates: do not measure the prefill limit")
    ap.add_argument("--limit-concurrency", type=int, default=4)
    ap.add_argument("--limit-prompts", type=int, default=9)
    ap.add_argument("--concurrency", type=int, default=0,
                    help="closed loop at this concurrency instead of rates (decode-step comparisons, profiling)")
    ap.add_argument("--num-requests", type=int, default=20, help="per rate and arm")
    ap.add_argument("--isl", default="uniform:128:2048")
    ap.add_argument("--osl", default="96")
    ap.add_argument("--workload", default="synthetic", choices=("synthetic", "long-mix", "shared-prefix", "multi-turn"))
    ap.add_argument("--long-isl", default="2048", help="long-mix: the long prompts")
    ap.add_argument("--long-fraction", type=float, default=0.2, help="long-mix: share of long prompts")
    ap.add_argument("--num-prefixes", type=int, default=4, help="shared-prefix")
    ap.add_argument("--prefix-len", type=int, default=1536, help="shared-prefix: tokens")
    ap.add_argument("--suffix-len", default="64", help="shared-prefix")
    ap.add_argument("--warm-prefixes", action="store_true", help="shared-prefix: send each prefix once before each "
                    "point, one at a time (steady state: a fleet that has served its prefixes before)")
    ap.add_argument("--turns", default="4", help="multi-turn")
    ap.add_argument("--think-time-s", default="0", help="multi-turn")
    ap.add_argument("--slo", default=SLO)
    ap.add_argument("--also-slo", default="", help="more SLOs to count goodput under, ';'-separated "
                    "(e.g. 'ttft_ms=1000,itl_ms=60')")
    ap.add_argument("--num-blocks", type=int, default=None,
                    help="KV blocks per engine, every arm alike (default: what VLLM_CPU_KVCACHE_SPACE holds)")
    ap.add_argument("--kv-transfer", choices=("pull", "push"), default=UP_KV_TRANSFER,
                    help="splitserve P/D arms that name none (default: `up`'s)")
    ap.add_argument("--max-duration-s", type=float, default=120.0)
    ap.add_argument("--timeout-s", type=float, default=180.0)
    ap.add_argument("--seed", type=int, default=29)
    ap.add_argument("--profile-s", type=float, default=0.0, help="py-spy every process for this long (0: no)")
    ap.add_argument("--log-dir", default="/tmp/peers")
    ap.add_argument("--server-log-level", default="warning",
                    help="splitserve's services' log level (debug: every route, in --log-dir's peers-*.log)")
    ap.add_argument("--out", type=Path, default=RESULTS / "peers.json")
    return ap


def main() -> None:
    suite = argparse.ArgumentParser(add_help=False)
    suite.add_argument("--suite", choices=("engines", "serving-layer"), default="engines")
    known, rest = suite.parse_known_args()
    if known.suite == "serving-layer":  # the serving layer alone against NVIDIA Dynamo (bench/peers_serving.py)
        from bench.peers_serving import main as serving_main

        serving_main(rest)
        return
    args = build_parser().parse_args(rest)
    args.dtype = args.dtype or ("bfloat16" if cpu_has_fast_bf16() else "float32")
    args.rate_fractions = [float(f) for f in args.rate_fractions.split(",") if f]
    args.also_slo = [t.strip() for t in args.also_slo.split(";") if t.strip()]
    for text in args.also_slo:
        parse_slo(text)  # a typo fails now, not after the first arm
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    order = [a for a in args.order.split(",") if a]
    unknown = [a for a in order if a not in ARMS]
    if unknown:
        raise SystemExit(f"unknown arms {unknown}: {', '.join(ARMS)}")
    model_cfg = require_model(args.model)
    rates = None if args.rate_fractions else [float(r) for r in args.rates.split(",") if r]
    args.limit_measured = bool(args.concurrency)
    began = time.monotonic()
    cond = conditions("peers", **{
        "model": args.model.resolve().name, "dtype": args.dtype,
        "model_shape": {k: model_cfg.get(k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                     "num_key_value_heads", "vocab_size")},
        "engine": "vLLM (vllm-cpu 0.32) in every arm, enforce_eager, block size 32, one engine per core",
        "cores": {"prefill_engine": PREFILL_CORE, "decode_engine": DECODE_CORE,
                  "control_plane_and_client": "prefill core for P/D arms; unpinned for aggregated arms"},
        "arms": {a: ARMS[a].what for a in dict.fromkeys(order)}, "order": order,
        "workload": {**workload_spec(args).describe(), "arrivals": "open loop, Poisson", "prompts": "random "
                     "token ids salted per point (no hits across points; within one: what the workload shares)",
                     "temperature": 0, "warm_prefixes": args.warm_prefixes and "each prefix sent once "
                     "(+16 tokens of its own, max_tokens 1), one at a time, before each point",
                     "ignore_eos": True, "endpoint": "/v1/completions, stream, continuous usage"},
        "num_requests_per_point": args.num_requests, "slo": args.slo, "also_slo": args.also_slo, "splitserve_kv_transfer": args.kv_transfer,
        "transfer_backend": "NIXL UCX (vLLM NixlConnector / NixlPushConnector), kv_buffer_device cpu",
        "concurrency": args.concurrency or None,
        "num_blocks_per_engine": args.num_blocks or "what 1 GiB of KV cache holds (VLLM_CPU_KVCACHE_SPACE=1)",
        "rates": None if args.concurrency else rates or f"the measured prefill limit x {args.rate_fractions}",
        "uptime": _uptime(),
        "note": "shared 2-core machine: compare arms within a pair of this run"})
    doc: dict[str, Any] = {"conditions": cond, "runs": []}
    for i, arm_name in enumerate(order):
        print(f"[{i}] {arm_name}: {ARMS[arm_name].what} ...", flush=True)
        try:
            run = run_arm(args, arm_name, i, rates)
            rates = rates or run.get("rates_from_limit")
            if "prefill_limit" in run:
                doc["prefill_limit"] = run["prefill_limit"]
        except Exception as exc:  # keep what finished
            run = {"arm": arm_name, "index": i, "error": repr(exc)}
        doc["runs"].append(run)
        for p in run.get("points", []):
            r = p["results"]
            print(f"  rate {p['rate']:g}: ok {r['num_ok']}/{r['num_requests']} goodput {r['goodput_requests_per_s']} "
                  f"TTFT p50 {r['ttft_ms']['p50']} ITL p99 {r['itl_ms']['p99']} TPOT p50/p90 {r['tpot_ms']['p50']}/"
                  f"{r['tpot_ms']['p90']}", flush=True)
        if "error" in run:
            print(f"  failed: {run['error']}", flush=True)
        write_result(args.out, doc)
    doc["summary"] = summarize(doc["runs"])
    finish(cond)
    cond["elapsed_s"] = round(time.monotonic() - began, 1)
    cond["uptime_after"] = _uptime()
    doc["plot"] = plot(doc, args.out.with_suffix(".png"))
    write_result(args.out, doc)
    print(f"wrote {args.out} ({cond['elapsed_s']} s)")


if __name__ == "__main__":
    main()
