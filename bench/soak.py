"""Soak: >= 20,000 requests through a mock P/D graph; nothing lost, memory flat, every block returned.

    python -m bench.soak [--requests 20000] [--concurrency 32]

Mixes short prompts (decode worker prefills locally) and long ones (remote prefill + simulated KV transfer),
streamed chat with usage. Records each process's resident memory after every round; growth is measured from
the end of warm-up (round 2) to the last round. Writes bench/results/soak.json with its conditions.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from tests.harness.graph import start_graph, worker_stats
from bench.lib.load import run_load_sync
from bench.lib.procs import rss_mib
from bench.lib.results import RESULTS, conditions, write_result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--out", type=Path, default=RESULTS / "soak.json")
    args = ap.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    num_blocks = 1024
    graph = start_graph(RESULTS, "--engine", "mock", "--prefill", "1", "--decode", "1", "--mock-speedup", "inf",
                        "--num-blocks", str(num_blocks), "--log-level", "warning")
    try:
        pids = graph.pids()
        per_round = args.requests // args.rounds
        rounds = []
        total_ok = total_err = 0
        for r in range(args.rounds):
            bodies = []
            for i in range(per_round):
                n = r * per_round + i
                # Every 4th request: a ~600-token unique prompt (remote prefill); the rest short.
                text = (f"request {n}: " + " ".join(f"w{(n * 7 + k) % 997}" for k in range(300))) if n % 4 == 0 \
                    else f"request {n}: say hello"
                bodies.append({"model": "tiny", "messages": [{"role": "user", "content": text}],
                               "max_tokens": args.max_tokens, "stream": True, "ignore_eos": True,
                               "stream_options": {"include_usage": True}})
            res = run_load_sync(graph.url, "/v1/chat/completions", bodies, args.concurrency,
                                expected_tokens=args.max_tokens)
            total_ok += res.num_ok
            total_err += res.num_errors
            rounds.append({"round": r, "ok": res.num_ok, "errors": res.num_errors,
                           "error_kinds": res.summary()["error_kinds"],
                           "requests_per_s": round(res.num_ok / res.wall_s, 1),
                           "rss_mib": {name: round(rss_mib(pid), 1) for name, pid in pids.items()}})
            print(json.dumps(rounds[-1]), flush=True)
        time.sleep(0.5)
        final = {w: (s.load.num_free_blocks, s.load.num_running) for w, s in worker_stats(graph.router).items()}
        warm, last = rounds[1]["rss_mib"], rounds[-1]["rss_mib"]
        growth = {name: round((last[name] - warm[name]) / warm[name], 4) for name in warm}
        result = {
            "bench": "soak",
            "conditions": conditions(
                "soak", model="tiny (tokenizer only; mock engine)", engine="mock, zero delay",
                pd_split="1 prefill : 1 decode (mock), remote prefill for ~600-token prompts",
                transfer_backend="simulated (mock)", num_requests=per_round * args.rounds,
                concurrency=args.concurrency, osl=args.max_tokens,
                isl="3/4 short chat (~20 tokens), 1/4 ~600-token chat", block_size=32,
                num_blocks_per_worker=num_blocks),
            "results": {"ok": total_ok, "errors": total_err, "lost": per_round * args.rounds - total_ok,
                        "rss_growth_after_warmup": growth, "max_rss_growth": max(growth.values()),
                        "final_worker_blocks": {w: {"free": f, "running": n} for w, (f, n) in final.items()},
                        "all_blocks_free": all(f == num_blocks and n == 0 for f, n in final.values()),
                        "rounds": rounds},
        }
        write_result(args.out, result)
        print(json.dumps({k: v for k, v in result["results"].items() if k != "rounds"}, indent=2))
    finally:
        graph.stop()


if __name__ == "__main__":
    main()
