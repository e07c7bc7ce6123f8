"""Frontend benchmark: request rate and CPU per request of the OpenAI frontend on a real local graph.

Starts ``splitserve up --engine mock --mock-speedup inf --aggregated 2`` (router, 2 zero-delay mock workers,
frontend; each its own process), then drives streaming chat completions through bench/lib/load.py and reads
each process's CPU (utime+stime from /proc/<pid>/stat) before and after.

  A (short): one-line user message, max_tokens 16, ignore_eos, 2,000 requests at concurrency 64.
  B (long):  the same with a user message that tokenizes to ~2,000 prompt tokens (exact count from usage).

Writes bench/results/frontend.json (results + conditions) and prints a summary.

    python bench/frontend.py [--requests 2000] [--concurrency 64] [--workloads short,long] [--client-core 1]
"""

from __future__ import annotations

import argparse
import os
import random
from pathlib import Path

import orjson

from bench.lib.graph import REPO, start_graph
from bench.lib.load import run_load_sync
from bench.lib.procs import CLK_TCK, proc_cpu_s, thread_cpu_s
from bench.lib.results import RESULTS, conditions, ensure_tiny_model, write_result

GOALS = {"short_min_requests_per_s": 750, "short_max_frontend_cpu_ms": 1.1, "long_max_frontend_cpu_ms": 3.0}
CHAT = "/v1/chat/completions"
# Words for long prompts (ordinary English prose, so the BPE tokenizer splits it like real text).
_WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches near "
          "an old river bank where people gather every morning to discuss weather politics music science "
          "history and the price of bread in small villages across the northern valley").split()


# ------------------------------------------------------------------------------------------- workloads

def long_text(tokenizer, target_tokens: int, seed: int = 0) -> str:
    """A user message whose chat-templated prompt is about ``target_tokens`` tokens."""
    rng = random.Random(seed)
    words = [rng.choice(_WORDS) for _ in range(target_tokens * 2)]

    def n_tokens(k: int) -> int:
        msg = [{"role": "user", "content": " ".join(words[:k])}]
        return len(tokenizer.apply_chat_template(msg).token_ids)

    lo, hi = 1, len(words)
    while lo < hi:  # smallest word count reaching the target
        mid = (lo + hi) // 2
        if n_tokens(mid) < target_tokens:
            lo = mid + 1
        else:
            hi = mid
    return " ".join(words[:lo])


def chat_bodies(model_name: str, texts: list[str], max_tokens: int) -> list[dict]:
    return [{"model": model_name, "messages": [{"role": "user", "content": t}], "max_tokens": max_tokens,
             "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True} for t in texts]


def measure(pids: dict[str, int], url: str, bodies: list[dict], concurrency: int, max_tokens: int) -> dict:
    threads0 = thread_cpu_s(pids["frontend"])
    cpu0 = {name: proc_cpu_s(pid) for name, pid in pids.items()}
    result = run_load_sync(url, CHAT, bodies, concurrency, expected_tokens=max_tokens)
    cpu1 = {name: proc_cpu_s(pid) for name, pid in pids.items()}
    threads1 = thread_cpu_s(pids["frontend"])
    summary = result.summary(expected_tokens=max_tokens)
    n = max(1, len(result.results))
    per_req = {name: round((cpu1[name] - cpu0[name]) * 1e3 / n, 4) for name in pids}
    workers = [k for k in pids if k.startswith("worker")]
    summary["cpu_ms_per_request"] = {
        "frontend": per_req.get("frontend"), "router": per_req.get("router"),
        "workers_total": round(sum(per_req[w] for w in workers), 4),
        **{k: per_req[k] for k in workers},
        "client": summary["client_cpu_ms_per_request"],
    }
    summary["frontend_threads_cpu_ms_per_request"] = {
        name: round((threads1[name] - threads0.get(name, 0.0)) * 1e3 / n, 4) for name in threads1
        if threads1[name] - threads0.get(name, 0.0) > 0}
    summary["cpu_s_total"] = {name: round(cpu1[name] - cpu0[name], 3) for name in pids}
    summary["frontend_cpu_utilisation"] = round((cpu1["frontend"] - cpu0["frontend"]) / result.wall_s, 3)
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--long-tokens", type=int, default=2000, help="target prompt tokens of workload B")
    ap.add_argument("--workloads", default="short,long")
    ap.add_argument("--warmup", type=int, default=200, help="requests sent (unmeasured) before each workload")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--client-core", type=int, default=None, help="pin the load client to this CPU")
    ap.add_argument("--model", type=Path, default=REPO / "models" / "tiny")
    ap.add_argument("--out", type=Path, default=RESULTS / "frontend.json")
    args = ap.parse_args()

    from services.frontend.tokenizer import ModelTokenizer

    ensure_tiny_model(args.model)
    model_name = args.model.resolve().name
    tokenizer = ModelTokenizer(args.model)
    if args.client_core is not None:
        os.sched_setaffinity(0, {args.client_core})
    cond = conditions(
        "frontend", model=model_name, osl=args.max_tokens, concurrency=args.concurrency,
        num_requests=args.requests, warmup_requests=args.warmup,
        pd_split=f"aggregated: {args.workers} workers (role both), no prefill pool",
        engine="mock, zero delay (--mock-speedup inf)", router_policy="kv", block_size=16, transfer_backend="none",
        request="POST /v1/chat/completions, stream=true, stream_options.include_usage=true, ignore_eos=true",
        prompts="unique per request (request index prepended to the user message)",
        client="bench/lib/client.py (aiohttp, keep-alive, SSE) in this process, one request in flight per slot",
        client_pinned_core=args.client_core,
        cpu_measure="utime+stime from /proc/<pid>/stat (all threads), after minus before the measured run, "
                    f"divided by requests; clock tick {1000 // CLK_TCK} ms")
    workloads: dict[str, list[str]] = {}
    for name in args.workloads.split(","):
        if name == "short":
            workloads["short"] = [f"Request {i}: tell me a short story about a fox." for i in range(args.requests)]
        elif name == "long":
            base = long_text(tokenizer, args.long_tokens)
            workloads["long"] = [f"Request {i}: {base}" for i in range(args.requests)]
        else:
            raise SystemExit(f"unknown workload {name!r}")

    RESULTS.mkdir(parents=True, exist_ok=True)
    graph = start_graph(RESULTS, "--engine", "mock", "--mock-speedup", "inf", "--aggregated", str(args.workers),
                        "--model", str(args.model), "--log-level", "warning", log_name="frontend-graph.log")
    results: dict[str, dict] = {}
    try:
        pids = cond["pids"] = graph.pids()
        for name, texts in workloads.items():
            isl = len(tokenizer.apply_chat_template([{"role": "user", "content": texts[0]}]).token_ids)
            bodies = chat_bodies(model_name, texts, args.max_tokens)
            if args.warmup:
                warm = chat_bodies(model_name, [f"warmup {i} " + texts[i % len(texts)] for i in range(args.warmup)],
                                   args.max_tokens)
                run_load_sync(graph.url, CHAT, warm, args.concurrency, expected_tokens=args.max_tokens)
            res = measure(pids, graph.url, bodies, args.concurrency, args.max_tokens)
            res["isl_prompt_tokens"] = res["prompt_tokens_seen"]
            res["isl_first_request_local_count"] = isl
            res["request_body_bytes"] = len(orjson.dumps(bodies[0]))  # as the client sends it
            results[name] = res
            if not graph.alive():
                raise SystemExit(f"graph died; see {graph.log_path}")
    finally:
        graph.stop()

    short, long_ = results.get("short"), results.get("long")
    goals = dict(GOALS)
    if short:
        goals["short_requests_per_s_met"] = short["requests_per_s"] >= GOALS["short_min_requests_per_s"]
        goals["short_frontend_cpu_met"] = short["cpu_ms_per_request"]["frontend"] <= GOALS["short_max_frontend_cpu_ms"]
    if long_:
        goals["long_frontend_cpu_met"] = long_["cpu_ms_per_request"]["frontend"] <= GOALS["long_max_frontend_cpu_ms"]
    write_result(args.out, {"bench": "frontend", "conditions": cond, "results": results, "goals": goals})

    mach = cond["machine"]
    print(f"frontend bench ({cond['timestamp']}, {mach['nproc']}x {mach['cpu_model']}, commit "
          f"{str(mach['git']['commit'])[:10]}{' +dirty' if mach['git']['dirty'] else ''})")
    for name, r in results.items():
        c = r["cpu_ms_per_request"]
        print(f"  {name:5s} ISL {r['prompt_tokens_seen']} OSL {args.max_tokens} c={args.concurrency} "
              f"n={r['num_requests']}: {r['requests_per_s']:.0f} req/s, ok {r['num_ok']} err {r['num_errors']}, "
              f"TTFT p50 {r['ttft_ms']['p50']} ms, e2e p50 {r['e2e_ms']['p50']} p99 {r['e2e_ms']['p99']} ms")
        print(f"        CPU ms/req: frontend {c['frontend']}  router {c['router']}  workers {c['workers_total']}  "
              f"client {c['client']}   (frontend busy {r['frontend_cpu_utilisation']:.0%})")
        print(f"        frontend threads CPU ms/req: {r['frontend_threads_cpu_ms_per_request']}")
    print("  goals:", {k: v for k, v in goals.items() if k.endswith("_met")})
    print(f"  wrote {args.out}")


if __name__ == "__main__":
    main()
