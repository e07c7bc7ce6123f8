"""Priorities and fair shares under overload (issue #32): the frontend's admission queue on a mock-engine graph.

The claim is about the admission layer (services/frontend/admission.py), not an engine: one `up --engine mock
--aggregated 1` graph whose capacity is the frontend's --max-inflight slots (the mock engine's batch is larger, so
it never queues; its step time grows with the batch, as an engine's does). Open-loop (Poisson) runs:

1. unloaded: short high-priority requests (priority 0) alone, at a small rate: their TTFT p99 is the reference;
2. overload: the same high-priority stream plus low-priority requests (priority 10) arriving at twice the
   capacity (the low priority's slots, --max-inflight less --reserved-inflight, over its measured service time):
   the high-priority TTFT p99 against run 1's (goal: within 1.2x), and what happened to the low-priority ones;
2b. the same overload with the short requests sent at the low priority: what they get without priorities (first
   come, first served behind the batch traffic);
3. shares: two tenants (x-tenant a and b, weights 3 and 1, one priority), each arriving at twice the capacity:
   the requests each got served over the run (goal: each share within 10% of its weight's).

Writes bench/results/priority.json with its conditions. Run: `flock /tmp/ss-heavy.lock python -m bench.priority`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import time
from pathlib import Path
from typing import Any

from bench.lib.client import Client, StreamResult
from bench.lib.results import RESULTS, conditions, finish, write_result
from tests.harness.graph import start_graph

HIGH, LOW = 0, 10


def _body(priority: int, max_tokens: int, n: int) -> dict[str, Any]:
    return {"model": "tiny", "prompt": f"request {n}: " + " ".join(f"w{(n * 7 + k) % 997}" for k in range(40)),
            "max_tokens": max_tokens, "ignore_eos": True, "stream": True, "priority": priority}


async def _open_loop(client: Client, rate_per_s: float, duration_s: float, priority: int, max_tokens: int,
                     seed: int) -> list[StreamResult]:
    """Poisson arrivals at ``rate_per_s`` for ``duration_s``; every request's result once all have ended."""
    rng = random.Random(seed)
    tasks = []
    start = time.perf_counter()
    n = 0
    while (now := time.perf_counter() - start) < duration_s:
        tasks.append(asyncio.create_task(client.stream("/v1/completions", _body(priority, max_tokens, seed * 10**6 + n))))
        n += 1
        await asyncio.sleep(rng.expovariate(rate_per_s))
    return list(await asyncio.gather(*tasks))


def _p(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 4)


def _summary(results: list[StreamResult]) -> dict[str, Any]:
    ttfts = [r.ttft_s for r in results if r.ok and r.ttft_s is not None]
    statuses = collections.Counter(r.status for r in results)
    return {"num_requests": len(results), "num_ok": sum(r.ok for r in results),
            "statuses": {str(k): v for k, v in sorted(statuses.items())},
            "ttft_p50_s": _p(ttfts, 0.5), "ttft_p90_s": _p(ttfts, 0.9), "ttft_p99_s": _p(ttfts, 0.99)}


async def _measure_service_s(url: str, num_slots: int, max_tokens: int) -> float:
    """Mean seconds a low-priority request holds its slot with all ``num_slots`` of its slots busy: that many
    closed loops of 4 requests each (none queues)."""
    client = Client(url)

    async def loop(i: int) -> list[StreamResult]:
        return [await client.stream("/v1/completions", _body(LOW, max_tokens, 1000 * i + k)) for k in range(4)]

    try:
        results = [r for rs in await asyncio.gather(*(loop(i) for i in range(num_slots))) for r in rs]
        assert all(r.ok for r in results), [r.error for r in results if not r.ok][:3]
        return sum(r.end_s - r.sent_s for r in results) / len(results)
    finally:
        await client.aclose()


async def _runs(url: str) -> dict[str, Any]:
    a = ARGS
    # Low-priority capacity: the slots it may hold (the reserved ones are the high priority's) over its service time.
    num_low_slots = a.max_inflight - a.reserved_inflight
    service_s = await _measure_service_s(url, num_low_slots, a.low_max_tokens)
    capacity_per_s = num_low_slots / service_s
    low_rate = 2.0 * capacity_per_s
    high = Client(url)
    try:
        unloaded = await _open_loop(high, a.high_rate, a.duration_s, HIGH, a.high_max_tokens, seed=1)
        low = Client(url)
        try:
            high_loaded, low_loaded = await asyncio.gather(
                _open_loop(high, a.high_rate, a.duration_s, HIGH, a.high_max_tokens, seed=1),
                _open_loop(low, low_rate, a.duration_s, LOW, a.low_max_tokens, seed=2))
            await asyncio.sleep(5.0)  # what the overload left running ends
            same_loaded, _ = await asyncio.gather(
                _open_loop(high, a.high_rate, a.duration_s, LOW, a.high_max_tokens, seed=1),
                _open_loop(low, low_rate, a.duration_s, LOW, a.low_max_tokens, seed=2))
        finally:
            await low.aclose()
    finally:
        await high.aclose()
    await asyncio.sleep(5.0)
    tenants = {}
    for name in ("a", "b"):
        tenants[name] = Client(url)
        tenants[name].headers["x-tenant"] = name
    try:
        share_runs = await asyncio.gather(*(
            _open_loop(tenants[name], 2.0 * capacity_per_s, a.duration_s, LOW, a.low_max_tokens, seed=3 + i)
            for i, name in enumerate(("a", "b"))))
    finally:
        for client in tenants.values():
            await client.aclose()
    unloaded_p99 = _summary(unloaded)["ttft_p99_s"]
    loaded_p99 = _summary(high_loaded)["ttft_p99_s"]
    served = {name: sum(r.ok for r in run) for name, run in zip(("a", "b"), share_runs)}
    total = sum(served.values()) or 1
    weights = {"a": 3.0, "b": 1.0}
    shares = {name: round(served[name] / total, 4) for name in served}
    share_errors = {name: round(abs(shares[name] / (weights[name] / 4.0) - 1.0), 4) for name in shares}
    ratio = round(loaded_p99 / unloaded_p99, 3) if unloaded_p99 and loaded_p99 else None
    return {
        "capacity": {"low_priority_slots": num_low_slots, "service_s": round(service_s, 4),
                     "requests_per_s": round(capacity_per_s, 2),
                     "low_priority_rate_per_s": round(low_rate, 2)},
        "unloaded_high": _summary(unloaded),
        "overload": {"high": _summary(high_loaded), "low": _summary(low_loaded)},
        "overload_without_priorities": {"short_requests_at_low_priority": _summary(same_loaded)},
        "high_ttft_p99_ratio": ratio,
        "high_ttft_goal_met": ratio is not None and ratio <= 1.2,
        "shares": {"weights": weights, "served": served, "shares": shares,
                   "relative_error": share_errors, "statuses": {
                       name: _summary(run)["statuses"] for name, run in zip(("a", "b"), share_runs)},
                   "goal_met": max(share_errors.values()) <= 0.10},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-inflight", type=int, default=8)
    ap.add_argument("--reserved-inflight", type=int, default=3)
    ap.add_argument("--max-queued", type=int, default=32)
    ap.add_argument("--high-rate", type=float, default=2.0, help="high-priority requests per second")
    ap.add_argument("--high-max-tokens", type=int, default=8)
    ap.add_argument("--low-max-tokens", type=int, default=32)
    ap.add_argument("--duration-s", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=RESULTS / "priority.json")
    global ARGS
    ARGS = ap.parse_args()
    a = ARGS
    graph_args = ("--engine", "mock", "--aggregated", "1", "--no-kvtier", "--log-level", "warning",
                  "--max-inflight", str(a.max_inflight), "--max-queued", str(a.max_queued),
                  "--reserved-inflight", str(a.reserved_inflight), "--reserved-max-priority", str(HIGH),
                  "--ttft-budgets", f"{HIGH}=1,{LOW}=30", "--tenant-weights", "a=3,b=1", "--frontends", "1")
    cond = conditions("priority", claim="the frontend's admission layer (mock engine graph: no engine is measured)",
                      graph=" ".join(graph_args), engine="mock (default timing, speedup 1)",
                      workload={"high_priority": HIGH, "low_priority": LOW, "high_rate_per_s": a.high_rate,
                                "high_max_tokens": a.high_max_tokens, "low_max_tokens": a.low_max_tokens,
                                "prompt_words": 40, "duration_s_per_run": a.duration_s, "arrivals": "Poisson",
                                "low_priority_rate": "2x capacity (max_inflight / measured service s)",
                                "tenants": "a and b at 2x capacity each, weights 3 and 1, priority 10"},
                      goals={"high_ttft_p99_ratio_max": 1.2, "share_relative_error_max": 0.10})
    graph = start_graph(RESULTS, *graph_args, log_name="priority-graph.log")
    try:
        results = asyncio.run(_runs(graph.url))
    finally:
        graph.stop()
    finish(cond)
    path = write_result(a.out, {"conditions": cond, **results})
    print(path.read_text())


ARGS: argparse.Namespace

if __name__ == "__main__":
    main()
