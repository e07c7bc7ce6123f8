"""The control plane's CPU per output token (issue 29): what the frontend, the router and the workers' own
processes spend beside the engines, idle and while streaming, on a mock P/D graph paced like this machine's
vLLM decode (the mock's default timing: ~34 ms a step of 8 sequences).

Each round starts ``splitserve up --engine mock --prefill 1 --decode 1 --no-kvtier``, reads every process's CPU
(/proc/<pid>/stat) over ``--idle-s`` with no load (a per-second cost: timers, heartbeats, polls), then over a
closed-loop stream load (``--concurrency`` at a time, /v1/completions with token-id prompts of ``--isl`` tokens,
``--osl`` tokens each, ignore_eos, stream with continuous usage: bench.peers' request). Per process it reports
CPU ms per second idle, CPU ms per output token under load, and that figure less the idle rate's share
(what each token itself costs). At bench.peers' 0.25 req/s x 96 tokens (24 tokens/s) an idle cost of
N ms/s reads as N/24 ms per output token there.

    python -m bench.token_cpu [--rounds 2] [--idle-s 20] [--concurrency 8] [--requests 48] [--label after]
        [--out bench/results/token_cpu.json]   # appends this run's label to the file's runs
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

from bench.frontend_cpu import cpu_snapshot
from bench.lib.load import run_load_sync
from bench.lib.results import RESULTS, conditions, finish, write_result
from tests.harness.graph import start_graph

GRAPH = ("--engine", "mock", "--prefill", "1", "--decode", "1", "--no-kvtier", "--log-level", "warning")


def _bodies(model: str, num: int, isl: int, osl: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"model": model, "prompt": [rng.randrange(100, 8000) for _ in range(isl)], "max_tokens": osl,
             "temperature": 0.0, "ignore_eos": True, "stream": True,
             "stream_options": {"include_usage": True, "continuous_usage_stats": True}} for _ in range(num)]


def _delta_ms(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: (after[k] - before[k]) * 1e3 for k in before if k in after}


def one_round(args: argparse.Namespace, index: int) -> dict[str, Any]:
    graph = start_graph(Path(args.log_dir), *GRAPH, log_name=f"token-cpu-{args.label}-{index}.log")
    try:
        pids = graph.pids()
        model = json.loads(__import__("urllib.request").request.urlopen(graph.url + "/v1/models").read())
        name = model["data"][0]["id"]
        run_load_sync(graph.url, "/v1/completions", _bodies(name, 2, args.isl, 8, seed=99), 2)  # warm-up
        time.sleep(2.0)
        c0, t0 = cpu_snapshot(pids), time.monotonic()
        time.sleep(args.idle_s)
        c1, idle_s = cpu_snapshot(pids), time.monotonic() - t0
        idle_ms_per_s = {k: v / idle_s for k, v in _delta_ms(c0, c1).items()}
        bodies = _bodies(name, args.requests, args.isl, args.osl, seed=index)
        c2, t2 = cpu_snapshot(pids), time.monotonic()
        res = run_load_sync(graph.url, "/v1/completions", bodies, args.concurrency, expected_tokens=args.osl)
        c3, load_s = cpu_snapshot(pids), time.monotonic() - t2
        tokens = res.num_ok * args.osl
        load_ms = _delta_ms(c2, c3)
        return {
            "round": index, "pids": pids, "idle_s": round(idle_s, 2), "load_s": round(load_s, 2),
            "num_ok": res.num_ok, "num_errors": res.num_errors, "output_tokens": tokens,
            "output_tokens_per_s": round(tokens / load_s, 1),
            "idle_cpu_ms_per_s": {k: round(v, 2) for k, v in idle_ms_per_s.items()},
            "load_cpu_ms_per_output_token": {k: round(v / max(1, tokens), 4) for k, v in load_ms.items()},
            "per_token_less_idle_ms": {k: round((v - idle_ms_per_s[k] * load_s) / max(1, tokens), 4)
                                       for k, v in load_ms.items()},
            "at_24_tokens_per_s_ms_per_token": {  # bench.peers' 0.25 req/s x 96 tokens
                k: round(idle_ms_per_s[k] / 24 + (v - idle_ms_per_s[k] * load_s) / max(1, tokens), 4)
                for k, v in load_ms.items()},
        }
    finally:
        graph.stop()


def summarize(runs: dict[str, Any]) -> dict[str, Any]:
    """Per label family (``before-1``, ``before-2`` -> ``before``): each process's mean idle ms/s, ms per output
    token under load, and ms per output token at 24 tokens/s, over its rounds."""
    families: dict[str, list[dict[str, Any]]] = {}
    for label, run in runs.items():
        families.setdefault(label.split("-")[0], []).extend(run["rounds"])
    out: dict[str, Any] = {}
    for family, rounds in families.items():
        def mean(key: str, proc: str) -> float:
            return round(sum(r[key][proc] for r in rounds) / len(rounds), 4)
        procs = sorted(rounds[0]["idle_cpu_ms_per_s"])
        out[family] = {"num_rounds": len(rounds), **{proc: {
            "idle_ms_per_s": mean("idle_cpu_ms_per_s", proc),
            "load_ms_per_output_token": mean("load_cpu_ms_per_output_token", proc),
            "per_token_less_idle_ms": mean("per_token_less_idle_ms", proc),
            "ms_per_output_token_at_24_tokens_per_s": mean("at_24_tokens_per_s_ms_per_token", proc)}
            for proc in procs}}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--idle-s", type=float, default=20.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--isl", type=int, default=512)
    ap.add_argument("--osl", type=int, default=128)
    ap.add_argument("--label", default="run", help="this run's name in the file (e.g. before, after)")
    ap.add_argument("--log-dir", default="/tmp/token-cpu")
    ap.add_argument("--out", type=Path, default=RESULTS / "token_cpu.json")
    args = ap.parse_args()
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    cond = conditions("token_cpu", graph="up " + " ".join(GRAPH), concurrency=args.concurrency,
                      isl=args.isl, osl=args.osl, requests=args.requests, idle_s=args.idle_s,
                      note="shared 2-core machine (other engineers' jobs running); CPU from /proc ticks (10 ms)")
    rounds = [one_round(args, i) for i in range(args.rounds)]
    finish(cond)
    doc = json.loads(args.out.read_text()) if args.out.exists() else {"runs": {}}
    doc["runs"][args.label] = {"conditions": cond, "rounds": rounds}
    doc["summary"] = summarize(doc["runs"])
    write_result(args.out, doc)
    for r in rounds:
        print(f"round {r['round']}: {r['output_tokens_per_s']} tokens/s, errors {r['num_errors']}")
        for k in sorted(r["idle_cpu_ms_per_s"]):
            print(f"  {k:18s} idle {r['idle_cpu_ms_per_s'][k]:6.2f} ms/s  load {r['load_cpu_ms_per_output_token'][k]:.4f}"
                  f" ms/token  less idle {r['per_token_less_idle_ms'][k]:.4f}"
                  f"  at 24 tok/s {r['at_24_tokens_per_s_ms_per_token'][k]:.4f}")


if __name__ == "__main__":
    main()
