"""Where a P/D graph's inter-token gaps come from: every token's arrival of an open-loop long-prompt mix, each gap
put in the context it was measured in: how many streams were decoding then, and whether the prefill engine on
the neighbouring core was computing a prompt (from the prefill worker's own `request_done` lines).

Issue 29's second goal (ITL p99 against two aggregated vLLM engines) is lost at 0.4-0.5 req/s; this says why
(docs/measuring.md, "Against vLLM's own P/D"):

    python -m bench.decode_steps [--arm ss-pd] [--rate 0.4] [--num-requests 48] \
        [--out bench/results/decode-steps.json]

One arm of bench/peers_arms.py (a splitserve one: the prefill worker's log is read), the long-mix workload of
bench.peers (20% of prompts 2,048 tokens, the rest 64-256, 96 output tokens, ignore_eos, greedy), the client on
the prefill core as bench.peers puts it. Gap = time between two streamed chunks of one request (one token each).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from bench.lib.client import Client, StreamResult
from bench.lib.results import MODEL_100M, RESULTS, conditions, finish, require_model, write_result
from bench.lib.workloads import WorkloadSpec, make_workload, poisson_arrivals
from bench.peers_arms import ARMS, PREFILL_CORE, start_arm
from services.worker.engines.vllm.dtype import cpu_has_fast_bf16

LONG_PROMPT_TOKENS = 1024  # a prefill at least this long is a "long prefill" next door


@dataclass(frozen=True)
class Stream:
    sent_s: float  # wall clock (time.time()) when the request was sent
    chunk_s: tuple[float, ...]  # each chunk's arrival, seconds after sent_s


@dataclass(frozen=True)
class Prefill:
    start_s: float  # wall clock
    end_s: float
    num_prompt_tokens: int


def prefills_from_log(lines: list[str]) -> list[Prefill]:
    """The prefill worker's prompts, from its `request_done` lines (kind=prefill): [done - duration, done]."""
    out = []
    for line in lines:
        if "request_done" not in line or "kind=prefill" not in line:
            continue
        fields = dict(re.findall(r"(\w+)=(\S+)", line))
        end_s = datetime.datetime.fromisoformat(line.split()[0].replace("Z", "+00:00")).timestamp()
        out.append(Prefill(end_s - float(fields["duration_ms"]) / 1e3, end_s, int(fields["num_prompt_tokens"])))
    return out


def gaps_in_context(streams: list[Stream], prefills: list[Prefill], max_streams: int = 3,
                    ) -> dict[tuple[int, str], list[float]]:
    """Every gap (ms) keyed by (streams decoding at its midpoint, capped at ``max_streams``; what the prefill
    engine did meanwhile: "idle", "prefill" or "long prefill", LONG_PROMPT_TOKENS or more)."""
    spans = [(s.sent_s + s.chunk_s[0], s.sent_s + s.chunk_s[-1]) for s in streams if s.chunk_s]
    out: dict[tuple[int, str], list[float]] = {}
    for s in streams:
        for a, b in zip(s.chunk_s, s.chunk_s[1:]):
            t0, t1 = s.sent_s + a, s.sent_s + b
            mid = (t0 + t1) / 2
            num_streams = min(sum(1 for start, end in spans if start <= mid <= end), max_streams)
            overlapping = [p for p in prefills if p.start_s < t1 and p.end_s > t0]
            busy = ("long prefill" if any(p.num_prompt_tokens >= LONG_PROMPT_TOKENS for p in overlapping)
                    else "prefill" if overlapping else "idle")
            out.setdefault((num_streams, busy), []).append((b - a) * 1e3)
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def summary(gaps: dict[tuple[int, str], list[float]]) -> list[dict]:
    return [{"streams": n, "prefill_engine": busy, "num_gaps": len(v), "p50_ms": round(percentile(v, 0.5), 1),
             "p90_ms": round(percentile(v, 0.9), 1), "p99_ms": round(percentile(v, 0.99), 1)}
            for (n, busy), v in sorted(gaps.items())]


async def run_load(url: str, model: str, args: argparse.Namespace) -> list[Stream]:
    spec = WorkloadSpec(kind="long-mix", isl="uniform:64:256", osl="96", long_isl="2048", long_fraction=0.2)
    sessions = make_workload(spec, args.num_requests, args.seed)
    arrivals = poisson_arrivals(len(sessions), args.rate, args.seed)
    client, t0 = Client(url), time.perf_counter()
    results: list[StreamResult] = [StreamResult() for _ in sessions]

    async def one(i: int) -> None:
        await asyncio.sleep(max(0.0, arrivals[i] - (time.perf_counter() - t0)))
        turn = sessions[i].turns[0]
        body = {"model": model, "prompt": turn.tokens, "max_tokens": turn.osl, "ignore_eos": True,
                "temperature": 0.0, "stream": True}
        await client.stream("/v1/completions", body, result=results[i])

    await asyncio.gather(*(one(i) for i in range(len(sessions))))
    await client.aclose()
    # perf_counter -> wall clock, to line up with the workers' log times.
    offset_s = time.time() - time.perf_counter()
    return [Stream(r.sent_s + offset_s, tuple(r.chunk_times_s)) for r in results if r.ok]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arm", default="ss-pd", choices=[a for a, arm in ARMS.items() if arm.system == "splitserve"])
    ap.add_argument("--model", type=Path, default=MODEL_100M)
    ap.add_argument("--rate", type=float, default=0.4)
    ap.add_argument("--num-requests", type=int, default=48)
    ap.add_argument("--seed", type=int, default=29)
    ap.add_argument("--log-dir", type=Path, default=Path("/tmp/splitserve-decode-steps"))
    ap.add_argument("--out", type=Path, default=RESULTS / "decode-steps.json")
    args = ap.parse_args()
    require_model(args.model)
    dtype = "bfloat16" if cpu_has_fast_bf16() else "float32"
    arm = ARMS[args.arm]
    doc_conditions = conditions("decode_steps", arm=args.arm, what=arm.what, model=args.model.name, dtype=dtype,
                                workload="long-mix: 20% 2,048-token prompts, else uniform 64-256; 96 output tokens",
                                rate=args.rate, num_requests=args.num_requests, seed=args.seed,
                                long_prefill_tokens=LONG_PROMPT_TOKENS)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    running = start_arm(arm, args.model, dtype, args.log_dir, "pull", 0, None, "info")
    try:
        os.sched_setaffinity(0, {PREFILL_CORE})  # after the graph started: its processes pin themselves
        streams = asyncio.run(run_load(running.url, args.model.name, args))
    finally:
        running.stop()
    log_lines = (args.log_dir / f"peers-0-{args.arm}.log").read_text(errors="replace").splitlines()
    gaps = gaps_in_context(streams, prefills_from_log(log_lines))
    every = [g for v in gaps.values() for g in v]
    finish(doc_conditions)
    doc = {"conditions": doc_conditions, "num_ok": len(streams),
           "all": {"num_gaps": len(every), "p50_ms": round(percentile(every, 0.5), 1),
                   "p99_ms": round(percentile(every, 0.99), 1)},
           "by_context": summary(gaps)}
    write_result(args.out, doc)
    for row in doc["by_context"]:
        print(row)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
