"""Frontend benchmark: request rate and CPU per request with 1 and 2 frontend processes, in one run.

Each run starts ``splitserve up --engine mock --mock-speedup inf --aggregated 2 --no-kvtier --frontends N``
(launcher, router, 2 zero-delay mock workers, N frontends sharing the port with SO_REUSEPORT; each its own
process), drives streaming chat completions through bench/lib/load.py, and reads every server process's CPU
(utime+stime from /proc/<pid>/stat) before and after. Graphs alternate A B A B (N=1, N=2, N=1, N=2, ...), a fresh
graph each run, so drift on a shared machine hits both alike.

  short: one-line user message, max_tokens 16, ignore_eos, --requests requests at concurrency 64.
  long:  the same with a user message that tokenizes to ~2,000 prompt tokens (exact count from usage).

Reference: NVIDIA Dynamo's published CPU cost on this machine class, ~744 req/s at c=64 with 2 zero-delay mocker
workers and ~2 ms of server CPU per request summed over all its processes. Goals: >= 1.5x that rate; <= 1.0 ms
server CPU (all processes) per short request; <= 1.5 ms frontend CPU per 2,000-token prompt.

Cores: the load client is pinned to the last core. With 4+ cores the server gets the others; with fewer it is left
on every core (so on 2 cores the client, 2 workers, the router and N frontends all compete: the result says so).

    python -m bench.frontend [--frontends 1,2] [--rounds 2] [--requests 2000]

Writes bench/results/frontend.json (results + conditions) and prints a summary.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
from pathlib import Path

import orjson

from bench.frontend_cpu import cpu_per_request, cpu_snapshot, server_processes
from tests.harness.graph import REPO, start_graph
from bench.lib.load import run_load_sync
from bench.lib.procs import CLK_TCK
from bench.lib.results import RESULTS, conditions, ensure_tiny_model, finish, write_result

DYNAMO_REQUESTS_PER_S = 744.0  # c=64, 2 zero-delay mocker workers
GOALS = {"min_requests_per_s": 1.5 * DYNAMO_REQUESTS_PER_S, "short_max_server_cpu_ms": 1.0,
         "long_max_frontend_cpu_ms": 1.5}
CHAT = "/v1/chat/completions"
# Words for long prompts (ordinary English prose, so the BPE tokenizer splits it like real text).
_WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches near "
          "an old river bank where people gather every morning to discuss weather politics music science "
          "history and the price of bread in small villages across the northern valley").split()


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


def core_plan(cores: list[int]) -> tuple[set[int], set[int]]:
    """(server cores, client cores): the client on the last core; the server on the rest when 3+ remain,
    else on every core (2 cores: one for the server would leave a second frontend nowhere to run)."""
    client = {cores[-1]}
    return (set(cores[:-1]) if len(cores) >= 4 else set(cores)), client


def measure(launcher_pid: int, url: str, bodies: list[dict], concurrency: int, max_tokens: int) -> dict:
    pids = server_processes(launcher_pid)
    cpu0 = cpu_snapshot(pids)
    result = run_load_sync(url, CHAT, bodies, concurrency, expected_tokens=max_tokens)
    cpu1 = cpu_snapshot(pids)
    summary = result.summary(expected_tokens=max_tokens)
    cpu = cpu_per_request(cpu0, cpu1, len(result.results))
    summary["cpu_ms_per_request"] = {**cpu.as_dict(), "client": summary["client_cpu_ms_per_request"]}
    summary["frontend_cpu_utilisation"] = round(cpu.frontends_total * len(result.results) / 1e3 / result.wall_s, 3)
    summary["pids"] = pids
    return summary


def one_graph(args, num_frontends: int, workloads: dict[str, list[str]], model_name: str, server_cores: set[int],
              client_cores: set[int], tokenizer) -> dict[str, dict]:
    os.sched_setaffinity(0, server_cores)  # the graph's processes inherit it
    graph = start_graph(RESULTS, "--engine", "mock", "--mock-speedup", "inf", "--aggregated", str(args.workers),
                        "--no-kvtier", "--frontends", str(num_frontends), "--model", str(args.model),
                        "--log-level", "warning", log_name=f"frontend-graph-{num_frontends}.log")
    os.sched_setaffinity(0, client_cores)
    out: dict[str, dict] = {}
    try:
        for name, texts in workloads.items():
            bodies = chat_bodies(model_name, texts, args.max_tokens)
            if args.warmup:
                warm = chat_bodies(model_name, [f"warmup {i} " + texts[i % len(texts)] for i in range(args.warmup)],
                                   args.max_tokens)
                run_load_sync(graph.url, CHAT, warm, args.concurrency, expected_tokens=args.max_tokens)
            res = measure(graph.proc.pid, graph.url, bodies, args.concurrency, args.max_tokens)
            isl = len(tokenizer.apply_chat_template([{"role": "user", "content": texts[0]}]).token_ids)
            res.update(isl_prompt_tokens=res["prompt_tokens_seen"], isl_first_request_local_count=isl,
                       request_body_bytes=len(orjson.dumps(bodies[0])), graph_startup_s=round(graph.startup_s, 2))
            out[name] = res
            if not graph.alive():
                raise SystemExit(f"graph died; see {graph.log_path}")
    finally:
        graph.stop()
    return out


def summarise(runs: list[dict]) -> dict[str, dict]:
    """Per N and workload: each run's numbers and their mean."""
    out: dict[str, dict] = {}
    for run in runs:
        for name, r in run["workloads"].items():
            s = out.setdefault(f"N={run['num_frontends']}", {}).setdefault(name, {
                "requests_per_s": [], "server_cpu_ms": [], "frontend_cpu_ms": [], "num_errors": 0})
            s["requests_per_s"].append(r["requests_per_s"])
            s["server_cpu_ms"].append(r["cpu_ms_per_request"]["server_total"])
            s["frontend_cpu_ms"].append(r["cpu_ms_per_request"]["frontends_total"])
            s["num_errors"] += r["num_errors"]
    for per_n in out.values():
        for s in per_n.values():
            for key in ("requests_per_s", "server_cpu_ms", "frontend_cpu_ms"):
                s[key + "_mean"] = round(statistics.fmean(s[key]), 4)
    return out


def goals_met(summary: dict[str, dict]) -> dict[str, object]:
    goals: dict[str, object] = dict(GOALS)
    for n, per_n in summary.items():
        if "short" in per_n:
            goals[f"{n} short_requests_per_s_met"] = per_n["short"]["requests_per_s_mean"] >= GOALS["min_requests_per_s"]
            goals[f"{n} short_server_cpu_met"] = per_n["short"]["server_cpu_ms_mean"] <= GOALS["short_max_server_cpu_ms"]
        if "long" in per_n:
            goals[f"{n} long_frontend_cpu_met"] = per_n["long"]["frontend_cpu_ms_mean"] <= GOALS["long_max_frontend_cpu_ms"]
    return goals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frontends", default="1,2", help="frontend process counts, alternated each round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--long-tokens", type=int, default=2000, help="target prompt tokens of the long workload")
    ap.add_argument("--workloads", default="short,long")
    ap.add_argument("--warmup", type=int, default=200, help="requests sent (unmeasured) before each workload")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--model", type=Path, default=REPO / "models" / "tiny")
    ap.add_argument("--out", type=Path, default=RESULTS / "frontend.json")
    args = ap.parse_args()

    from services.frontend.tokenizer import ModelTokenizer

    ensure_tiny_model(args.model)
    model_name = args.model.resolve().name
    tokenizer = ModelTokenizer(args.model)
    cores = sorted(os.sched_getaffinity(0))
    server_cores, client_cores = core_plan(cores)
    counts = [int(n) for n in args.frontends.split(",")]
    cond = conditions(
        "frontend", model=model_name, osl=args.max_tokens, concurrency=args.concurrency,
        num_requests=args.requests, warmup_requests=args.warmup, frontends=counts, rounds=args.rounds,
        order="A B A B: each round runs every N in turn, a fresh graph each",
        pd_split=f"aggregated: {args.workers} workers (role both), no prefill pool, no kvtier",
        engine="mock, zero delay (--mock-speedup inf)", router_policy="kv", transfer_backend="none",
        request="POST /v1/chat/completions, stream=true, stream_options.include_usage=true, ignore_eos=true",
        prompts="unique per request (request index prepended to the user message)",
        client="bench/lib/client.py (aiohttp, keep-alive, SSE) in this process, one request in flight per slot",
        server_cores=sorted(server_cores), client_cores=sorted(client_cores),
        core_note=("server and client share every core: the load client, 2 workers, the router and N frontends "
                   "compete for them, so a second frontend can only add rate where a core has idle time"
                   if server_cores & client_cores else "server and client on separate cores"),
        reference=f"NVIDIA Dynamo: ~{DYNAMO_REQUESTS_PER_S:.0f} req/s at c=64, 2 zero-delay mocker workers, "
                  "~2 ms server CPU per request (all processes)",
        cpu_measure="utime+stime from /proc/<pid>/stat (all threads) of every process of the launcher's tree "
                    "(launcher, router, workers, frontends), after minus before the measured run, divided by "
                    f"requests; clock tick {1000 // CLK_TCK} ms")
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
    runs = []
    for round_index in range(args.rounds):
        for n in counts:
            runs.append({"round": round_index, "num_frontends": n, "workloads": one_graph(
                args, n, workloads, model_name, server_cores, client_cores, tokenizer)})
    os.sched_setaffinity(0, set(cores))
    finish(cond)
    summary = summarise(runs)
    goals = goals_met(summary)
    write_result(args.out, {"bench": "frontend", "conditions": cond, "summary": summary, "runs": runs,
                            "goals": goals})
    print_report(cond, summary, runs, goals, args)


def print_report(cond: dict, summary: dict, runs: list[dict], goals: dict, args) -> None:
    mach = cond["machine"]
    print(f"frontend bench ({cond['timestamp']}, {mach['nproc']}x {mach['cpu_model']}, load {mach['loadavg']} -> "
          f"{mach['loadavg_after']}, commit {str(mach['git']['commit'])[:10]}{' +dirty' if mach['git']['dirty'] else ''})")
    print(f"  cores: server {cond['server_cores']} client {cond['client_cores']}: {cond['core_note']}")
    for run in runs:
        for name, r in run["workloads"].items():
            c = r["cpu_ms_per_request"]
            print(f"  round {run['round']} N={run['num_frontends']} {name:5s} ISL {r['prompt_tokens_seen']} "
                  f"OSL {args.max_tokens} c={args.concurrency} n={r['num_requests']}: {r['requests_per_s']:.0f} req/s"
                  f" (err {r['num_errors']}), TTFT p50 {r['ttft_ms']['p50']} ms, e2e p99 {r['e2e_ms']['p99']} ms")
            print(f"      CPU ms/req: server {c['server_total']} = frontends {c['frontends_total']} + router "
                  f"{c['router']} + workers {c['workers_total']} + launcher {c['launcher']};  client {c['client']}")
    for n, per_n in summary.items():
        for name, s in per_n.items():
            print(f"  {n} {name:5s} mean: {s['requests_per_s_mean']:.0f} req/s, server {s['server_cpu_ms_mean']} "
                  f"ms/req, frontend {s['frontend_cpu_ms_mean']} ms/req")
    print("  goals:", {k: v for k, v in goals.items() if k.endswith("_met")})
    print(f"  wrote {args.out}")


if __name__ == "__main__":
    main()
