"""The report of bench/routing.py: one run's reuse and latency, the router's own counters, medians and ratios over
repeats, the goals.

Reuse = sum(cached_tokens) / sum(prompt_tokens) over the answers that succeeded (``cached_token_share`` of
bench/lib/metrics.py); latencies as defined there.
"""

from __future__ import annotations

from typing import Any

from bench.lib.metrics import aggregate
from bench.lib.server import scrape
from bench.routing_workload import Answer

GOALS = {"reuse_min": 0.95, "ttft_p50_speedup_vs_round_robin_min": 1.5}


def summarize(answers: list[Answer], wall_s: float, prefix_tokens: int) -> dict[str, Any]:
    """``metrics.aggregate`` over the run (duration: its wall time), plus reuse, in the second half too."""
    ok = [a for a in answers if a.res.ok]
    out = aggregate([a.res.timing() for a in answers], wall_s, ndigits=4)
    # Second half only: past the cold start, what the routing sustains.
    late = [a.res.timing() for a in ok if a.sent_s >= wall_s / 2]
    late_share = aggregate(late, wall_s)["cached_token_share"] if late else None
    out.update({
        "reuse": out["cached_token_share"], "reuse_second_half": late_share, "wall_s": round(wall_s, 2),
        "missing_cached_tokens": sum(1 for a in ok if a.res.cached_tokens is None),
        "cold_requests": sum(1 for a in ok if (a.res.cached_tokens or 0) < prefix_tokens // 2),
        # The tail's requests (what a p99 is made of): when sent, which prefix, how much was reused.
        "slowest": [{"ttft_ms": round((a.res.ttft_s or 0.0) * 1000, 1), "sent_s": round(a.sent_s, 3),
                     "prefix": a.prefix, "cached_tokens": a.res.cached_tokens}
                    for a in sorted((a for a in ok if a.res.ttft_s is not None), key=lambda a: -(a.res.ttft_s or 0.0))[:10]],
    })
    return out


def router_metrics(port: int) -> dict[str, Any]:
    """The router's counters and gauges (``splitserve_router_*``, prefix dropped) from its metrics port."""
    parsed = scrape(f"http://127.0.0.1:{port}/metrics")
    if parsed is None:
        return {"error": f"no metrics at 127.0.0.1:{port}"}
    return {k.removeprefix("splitserve_router_"): v for k, v in parsed.items()
            if k.startswith("splitserve_router_") and "_bucket" not in k and not k.split("{")[0].endswith("_created")}


def router_view(metrics: dict[str, float]) -> dict[str, Any]:
    blocks = metrics.get("request_blocks_total", 0.0)
    routes = metrics.get("decision_seconds_count", 0.0)
    return {
        "predicted_hit_rate": round(metrics.get("predicted_hit_blocks_total", 0.0) / blocks, 4) if blocks else None,
        "best_overlap_rate": round(metrics.get("best_overlap_blocks_total", 0.0) / blocks, 4) if blocks else None,
        "routes": routes,
        "decision_mean_us": round(metrics.get("decision_seconds_sum", 0.0) / routes * 1e6, 1) if routes else None,
        "kv_events_applied": metrics.get("kv_events_applied_total"),
        "kv_event_gaps": metrics.get("kv_event_gaps_total"),
    }


def median(values: list[float]) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def aggregate_runs(runs: list[dict[str, Any]], policies: tuple[str, ...]) -> dict[str, Any]:
    per: dict[str, dict[str, Any]] = {}
    for p in policies:
        mine = [r for r in runs if r["policy"] == p]
        per[p] = {
            "reuse": median([r["reuse"] for r in mine]),
            "ttft_p50_ms": median([r["ttft_ms"]["p50"] for r in mine]),
            "ttft_p99_ms": median([r["ttft_ms"]["p99"] for r in mine]),
            "requests_per_s": median([r["requests_per_s"] for r in mine]),
            "output_tokens_per_s": median([r["output_tokens_per_s"] for r in mine]),
            "errors": sum(r["num_errors"] for r in mine), "repeats": len(mine),
        }
    ratios: dict[str, Any] = {}
    kv = per.get("kv")
    for other in policies:
        if other == "kv" or kv is None:
            continue
        o = per[other]
        ratios[f"kv_vs_{other}"] = {
            "reuse": _ratio(kv["reuse"], o["reuse"]),
            "ttft_p50_speedup": _ratio(o["ttft_p50_ms"], kv["ttft_p50_ms"]),
            "ttft_p99_speedup": _ratio(o["ttft_p99_ms"], kv["ttft_p99_ms"]),
            "throughput": _ratio(kv["requests_per_s"], o["requests_per_s"]),
        }
        # Per-repeat ratios (A B C interleaved): how stable the comparison is on a noisy machine.
        pairs = [(a, b) for a, b in zip([r for r in runs if r["policy"] == "kv"],
                                        [r for r in runs if r["policy"] == other])]
        ratios[f"kv_vs_{other}"]["ttft_p50_speedup_per_repeat"] = [
            _ratio(b["ttft_ms"]["p50"], a["ttft_ms"]["p50"]) for a, b in pairs]
    return {"per_policy": per, "ratios": ratios}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def summary(runs: list[dict[str, Any]], policies: tuple[str, ...], ceiling: float,
            goals: dict[str, float] | None = None) -> dict[str, Any]:
    """Medians and ratios of the runs so far, against the reuse ceiling and the goals (``GOALS`` by default)."""
    agg = aggregate_runs(runs, tuple(p for p in policies if any(r["policy"] == p for r in runs)))
    kv = agg["per_policy"].get("kv", {})
    rr = agg["ratios"].get("kv_vs_round-robin", {})
    agg["reuse_max"] = round(ceiling, 4)
    agg["reuse_of_max"] = {p: _ratio(v["reuse"], ceiling) for p, v in agg["per_policy"].items()}
    if goals and "ttft_p99_ratio_vs_round_robin_max" in goals:
        agg["goal_met"] = _ratio_goals(agg, goals)
        return agg
    agg["goal_met"] = {
        "reuse": kv.get("reuse") is not None and kv["reuse"] >= GOALS["reuse_min"],
        "reuse_goal_reachable": ceiling >= GOALS["reuse_min"],
        "ttft_p50_speedup": (rr.get("ttft_p50_speedup") or 0) >= GOALS["ttft_p50_speedup_vs_round_robin_min"],
    }
    return agg


def _ratio_goals(agg: dict[str, Any], goals: dict[str, float]) -> dict[str, Any]:
    """kv's reuse, and its TTFT p50 and p99 as fractions of round-robin's (issue 16's goals)."""
    kv = agg["per_policy"].get("kv", {})
    rr = agg["per_policy"].get("round-robin", {})
    p50 = _ratio(kv.get("ttft_p50_ms"), rr.get("ttft_p50_ms"))
    p99 = _ratio(kv.get("ttft_p99_ms"), rr.get("ttft_p99_ms"))
    met = {
        "reuse": kv.get("reuse") is not None and kv["reuse"] >= goals["reuse_min"],
        "ttft_p50_ratio_vs_round_robin": p50,
        "ttft_p50": p50 is not None and p50 <= goals["ttft_p50_ratio_vs_round_robin_max"],
        "ttft_p99_ratio_vs_round_robin": p99,
        "ttft_p99": p99 is not None and p99 <= goals["ttft_p99_ratio_vs_round_robin_max"],
    }
    met["all"] = met["reuse"] and met["ttft_p50"] and met["ttft_p99"]
    return met
