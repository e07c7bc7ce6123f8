"""KV-aware routing benchmark: prefix reuse, TTFT and throughput of kv vs round-robin vs random routing.

For each workload and each policy it starts a fresh graph (``splitserve up --engine mock --aggregated 4
--router-policy P``; the restart makes every policy start with cold caches), drives streaming
``/v1/completions`` with token-id prompts (exact lengths, no tokenizer in the way) through bench/lib/client.py,
reads ``usage.prompt_tokens_details.cached_tokens`` of every answer, scrapes the
router's Prometheus metrics and stops the graph. Policies are interleaved (A B C A B C ...) over repeats.

Workloads (defaults; every size is a flag):

  shared     8 prefixes of 2,000 tokens, each request = a uniformly drawn prefix + a unique 50-token suffix,
             800 requests at concurrency 16, 16 output tokens (ignore_eos).
  zipf       the same with prefix popularity ~ 1/rank**1.1 (zipf s=1.1 over the 8 prefixes).
  multiturn  32 sessions x 4 turns at concurrency 16 (16 sessions in flight, each one turn at a time):
             session i opens with prefix i % 8 + 50 user tokens; each later turn's prompt is the previous
             prompt + the 16 answer tokens + 50 new user tokens. The answer's token ids are the mock
             engine's (a pure function of the sequence, recomputed here), so turns can reuse the answer.
  vllm       2 real vLLM workers (tiny model, fp32, prefix caching on; they publish KV events, so routing is
             exact): 4 prefixes of 1,000 tokens, 120 requests at concurrency 4, kv vs round-robin.

KV room per mock worker: ``--num-blocks`` defaults to what holds ``--prefixes-per-worker`` (4) prefixes plus
every in-flight request's private blocks (see ``mock_num_blocks``), so 4 workers x 4 cannot hold all 8
prefixes everywhere: a policy that spreads each prefix over every worker thrashes, one that keeps each prefix
on 1-2 workers does not.

Reuse = sum(cached_tokens) / sum(prompt_tokens) over all answers. Its ceiling (``reuse_max``) is what an
infinite single cache would reuse on the same request stream (each prefix's first request is cold, every
suffix is new); ``reuse_of_max`` = reuse / reuse_max.

    python -m bench.routing                              # shared, zipf, multiturn; kv, round-robin, random
    python -m bench.routing --workloads shared --repeats 2
    python -m bench.routing --workloads vllm

Writes (merges per workload into) bench/results/routing.json and prints a summary.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

from bench import routing_report as report
from tests.harness.graph import start_graph, tiny_model_dir, worker_stats
from bench.lib.machine import loadavg
from bench.lib.results import RESULTS, write_result
from bench.lib.results import conditions as results_conditions
from bench.routing_workload import (AnswerTokens, Workload, build, drive, mock_num_blocks, reuse_ceiling, stream_of,
                                    workloads)
from cli.launcher import free_port
from common.tiny_model import validate_model_dir
from services.router.policy import PolicyConfig

DYNAMO_REFERENCE = {
    "version": "1.6.1", "workload": "shared (8 x 2,000-token prefixes, 4 mock workers, concurrency 16)",
    "reuse_kv": [0.91, 0.92], "reuse_round_robin": 0.58, "ttft_p50_ms_kv": 80, "ttft_p50_ms_round_robin": [92, 116],
}


def run_one(w: Workload, policy: str, args: argparse.Namespace, num_blocks: int | None,
            answer_tokens: AnswerTokens | None, tmp: Path) -> dict[str, Any]:
    """One fresh graph with ``policy``, the workload through it, the router's and workers' counters after."""
    metrics_port = free_port()
    graph_args = ["--engine", w.engine, "--aggregated", str(w.num_workers), "--router-policy", policy,
                  "--block-size", str(args.block_size), "--router-metrics-port", str(metrics_port)]
    if w.engine == "mock":
        graph_args += ["--mock-speedup", str(args.speedup)]
    else:
        graph_args += ["--dtype", "float32"]
    if num_blocks is not None:
        graph_args += ["--num-blocks", str(num_blocks)]
    if args.prefill_weight is not None:
        graph_args += ["--router-prefill-weight", str(args.prefill_weight)]
    if args.busy_threshold is not None:
        graph_args += ["--router-busy-threshold", str(args.busy_threshold)]
    if not args.kvtier:
        graph_args += ["--no-kvtier"]  # the device KV alone: what the routing has to manage
    graph = start_graph(tmp, *graph_args, ready_timeout_s=600.0)
    load0 = loadavg()[0]
    try:
        answers, wall = uvloop.run(drive(graph.url, "tiny", w, answer_tokens))
        time.sleep(0.3)  # last heartbeats and events
        metrics = report.router_metrics(metrics_port)
        try:
            stats = {wid: {"prefix_hits": s.num_prefix_hits, "free_blocks": s.load.num_free_blocks}
                     for wid, s in worker_stats(graph.router).items()}
        except Exception as exc:  # stats are a diagnostic, not the result
            stats = {"error": repr(exc)}
    finally:
        graph.stop()
    out = report.summarize(answers, wall, w.prefix_tokens)
    hits = [v.get("prefix_hits", 0) for v in stats.values() if isinstance(v, dict)]
    if w.engine == "vllm" and out["cached_tokens"] == 0 and sum(hits) > 0 and out["prompt_tokens"]:
        # usage.cached_tokens reads 0 behind vLLM workers; their prefix-hit token counters do not, but they
        # can exceed the reuse ceiling (vLLM counts lookups, not first schedules): a diagnostic, not the result.
        out["worker_prefix_hit_tokens_per_prompt_token"] = round(sum(hits) / out["prompt_tokens"], 4)
        out["reuse_note"] = "usage.cached_tokens was 0 for every answer behind vLLM workers"
    # Requests per prefix per worker is not visible to the client; prefix hits per worker are.
    out.update(policy=policy, graph_startup_s=round(graph.startup_s, 1), load_avg_1m_before=load0,
               load_avg_1m_after=loadavg()[0], router=report.router_view(metrics), workers=stats,
               router_metrics=metrics, command="splitserve up " + " ".join(graph_args))
    return out


def _router_defaults(config: PolicyConfig) -> dict[str, Any]:
    """The kv policy's knobs as this run's router had them (the cost config's topology left out)."""
    cost = {k: v for k, v in dataclasses.asdict(config.cost).items() if k != "topology"}
    return {**{k: v for k, v in dataclasses.asdict(config).items() if k != "cost"}, "cost": cost}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default="shared,zipf,multiturn", help="shared,zipf,multiturn,vllm,vllm-pressure,vllm-tier")
    ap.add_argument("--policies", default="", help="override, e.g. kv,round-robin (default: per workload)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--speedup", type=float, default=1.0, help="mock timing divided by this")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--prefixes", type=int, default=8)
    ap.add_argument("--prefix-tokens", type=int, default=2000)
    ap.add_argument("--suffix-tokens", type=int, default=50)
    ap.add_argument("--output-tokens", type=int, default=16)
    ap.add_argument("--requests", type=int, default=800)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--prefixes-per-worker", type=float, default=4, help="KV room per mock worker, in prefixes")
    ap.add_argument("--num-blocks", type=int, default=0, help="override the computed KV blocks per mock worker")
    ap.add_argument("--vllm-num-blocks", type=int, default=0, help="KV blocks per vLLM worker (0: from memory)")
    ap.add_argument("--prefill-weight", type=float, default=None, help="router kv prefill weight (default: its own)")
    ap.add_argument("--busy-threshold", type=float, default=None, help="router busy threshold (default: its own)")
    ap.add_argument("--kvtier", action="store_true", help="keep `up`'s shared KV tier (default: --no-kvtier)")
    ap.add_argument("--out", type=Path, default=RESULTS / "routing.json")
    ap.add_argument("--note", default="", help="free text stored with the results")
    ap.add_argument("--tag", default="", help="suffix of the workload's key in the results (e.g. @speedup1)")
    args = ap.parse_args()
    # A timeout's SIGTERM must still stop the graph (the finally in run_one), like Ctrl-C does.
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    model_dir = tiny_model_dir()
    vocab = validate_model_dir(model_dir).vocab_size
    answer_tokens = AnswerTokens(model_dir)
    chosen = [s for s in args.workloads.split(",") if s]
    all_workloads = workloads(args)
    defaults = PolicyConfig()  # the router's, recorded when not overridden
    results: dict[str, Any] = {}
    if args.out.exists():
        try:
            results = json.loads(args.out.read_text())
        except ValueError:
            results = {}
    results.setdefault("benchmark", "routing")
    results["goals"] = report.GOALS
    results["dynamo_reference"] = DYNAMO_REFERENCE
    results.setdefault("workloads", {})
    for name in chosen:
        w = build(all_workloads[name], vocab)
        if args.policies:
            w.policies = tuple(args.policies.split(","))
        wargs = argparse.Namespace(**{**vars(args), **w.graph})  # the workload's fixed graph settings win
        if w.engine == "mock":
            num_blocks, why = mock_num_blocks(w, int(args.prefixes_per_worker), wargs.block_size)
            if wargs.num_blocks:
                fixed = "the workload's" if "num_blocks" in w.graph else "--num-blocks"
                num_blocks, why = wargs.num_blocks, f"{wargs.num_blocks} ({fixed}; computed: {why})"
        else:
            num_blocks = args.vllm_num_blocks or None
            why = f"{num_blocks} (--vllm-num-blocks)" if num_blocks else "vLLM default (from --kv-cache-gib 1)"
        stream = stream_of(w, answer_tokens if w.engine == "mock" else None)
        ceiling = reuse_ceiling(stream, wargs.block_size)
        conditions = results_conditions(
            "routing", model="tiny (embedded Llama, vocab 8192)" + (
                f"; mock timing = default TimingModel (~100M model on 2 CPU cores) / speedup {wargs.speedup}"
                if w.engine == "mock" else "; real vLLM on CPU, float32, prefix caching on; the workers "
                "publish KV events (exact-mode routing)"),
            block_size=wargs.block_size, num_blocks_per_worker=num_blocks, num_blocks_why=why,
            prefill_decode_workers="aggregated (no prefill pool), no transfers",
            transfer_backend="none (aggregated)", policies=list(w.policies), repeats=args.repeats,
            order="interleaved: " + " ".join(list(w.policies) * args.repeats) + ", fresh graph (cold caches) each",
            router_prefill_weight=args.prefill_weight if args.prefill_weight is not None else defaults.prefill_weight,
            router_busy_threshold=args.busy_threshold if args.busy_threshold is not None else defaults.busy_threshold,
            router_defaults=_router_defaults(defaults), kvtier=args.kvtier, workload=w.describe(),
            goals=w.goals or report.GOALS, note=args.note)
        print(f"== {name}: {json.dumps(w.describe())}\n   num_blocks {why}; reuse ceiling {ceiling:.4f}", flush=True)
        runs: list[dict[str, Any]] = []

        def save(complete: bool) -> dict[str, Any]:
            """Written after every run, so a cut-short invocation still leaves the runs it finished."""
            agg = report.summary(runs, w.policies, ceiling, w.goals)
            agg["complete"] = complete
            results["workloads"][name + args.tag] = {"conditions": conditions, "summary": agg, "runs": runs}
            write_result(args.out, results)
            return agg

        with tempfile.TemporaryDirectory(prefix="routing-") as tmp:
            for rep in range(args.repeats):
                for policy in w.policies:
                    run = run_one(w, policy, wargs, num_blocks, answer_tokens, Path(tmp))
                    run["repeat"] = rep
                    runs.append(run)
                    print(f"   {policy:12s} rep {rep}: reuse {run['reuse']} (2nd half {run['reuse_second_half']}) "
                          f"ttft p50 {run['ttft_ms']['p50']} p99 {run['ttft_ms']['p99']} ms, "
                          f"{run['requests_per_s']} req/s, wall {run['wall_s']} s, errors {run['num_errors']}, "
                          f"router {run['router']}", flush=True)
                    save(complete=False)
        print(f"   summary: {json.dumps(save(complete=True))}", flush=True)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

