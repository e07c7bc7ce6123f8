"""The numbers and verdicts of bench/frontend_hostile.py: pure functions over timings and RSS samples.

A run is a list of phases (warmup, baseline, hostile, ..., recovery), each ``Phase(name, kind, start_s, end_s)``
on one clock. A normal stream belongs to the phase it was *sent* in. Latency summaries use bench/lib/metrics.py
(TTFT, per-token ITL gaps, linear-interpolated percentiles). The goals:

- **latency**: the normal streams' TTFT p99 and ITL p99 over all hostile phases at most ``max_ratio`` times the
  same over all baseline phases;
- **memory**: the frontend's RSS at the end of the run (recovery) at most ``1 + rss_tolerance`` times its RSS at
  the end of the first baseline phase (before any hostile client).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from bench.lib.metrics import RequestTiming, aggregate, percentile


@dataclass(frozen=True)
class Phase:
    name: str  # "baseline-1", "hostile-1", ...
    kind: str  # "warmup" | "baseline" | "hostile" | "recovery"
    start_s: float
    end_s: float


def phase_plan(kinds: Sequence[str], durations_s: dict[str, float], start_s: float = 0.0) -> list[Phase]:
    """Back-to-back phases of ``kinds`` (their durations by kind), numbered per kind: baseline-1, hostile-1..."""
    out: list[Phase] = []
    seen: dict[str, int] = {}
    t = start_s
    for kind in kinds:
        seen[kind] = seen.get(kind, 0) + 1
        out.append(Phase(f"{kind}-{seen[kind]}", kind, t, t + durations_s[kind]))
        t += durations_s[kind]
    return out


def phase_at(phases: Sequence[Phase], t_s: float) -> Phase | None:
    """The phase ``t_s`` falls in (start inclusive, end exclusive); None before or after them all."""
    for phase in phases:
        if phase.start_s <= t_s < phase.end_s:
            return phase
    return None


def by_phase(phases: Sequence[Phase], sent: Sequence[tuple[float, RequestTiming]]) -> dict[str, list[RequestTiming]]:
    """Requests ``(send time, timing)`` grouped by the name of the phase they were sent in."""
    out: dict[str, list[RequestTiming]] = {p.name: [] for p in phases}
    for t_s, timing in sent:
        phase = phase_at(phases, t_s)
        if phase is not None:
            out[phase.name].append(timing)
    return out


def latency_summary(requests: Sequence[RequestTiming], duration_s: float) -> dict[str, Any]:
    """``metrics.aggregate`` trimmed to what this bench reports."""
    agg = aggregate(requests, duration_s)
    keys = ("num_requests", "num_ok", "num_errors", "error_kinds", "requests_per_s", "output_tokens_per_s",
            "ttft_ms", "itl_ms", "e2e_ms")
    return {k: agg[k] for k in keys}


def pooled(phases: Sequence[Phase], grouped: dict[str, list[RequestTiming]], kind: str) -> dict[str, Any]:
    """The latency summary over every phase of ``kind`` together."""
    chosen = [p for p in phases if p.kind == kind]
    requests = [r for p in chosen for r in grouped.get(p.name, [])]
    return latency_summary(requests, sum(p.end_s - p.start_s for p in chosen))


def ratio(hostile: float | None, baseline: float | None) -> float | None:
    if hostile is None or not baseline:
        return None
    return round(hostile / baseline, 3)


class RssSummary(NamedTuple):
    before_mib: float | None  # last sample of the first baseline phase
    peak_mib: float | None  # largest sample of the whole run
    after_mib: float | None  # last sample of the run (end of recovery)
    growth: float | None  # after / before - 1


def rss_summary(phases: Sequence[Phase], samples: Sequence[tuple[float, float]]) -> RssSummary:
    """From ``(time, RSS MiB)`` samples of the frontend."""
    if not samples:
        return RssSummary(None, None, None, None)
    first_base = next((p for p in phases if p.kind == "baseline"), None)
    before = None
    if first_base is not None:
        inside = [mib for t, mib in samples if first_base.start_s <= t < first_base.end_s]
        before = inside[-1] if inside else None
    after = samples[-1][1]
    growth = None if before is None else round(after / before - 1.0, 4)
    return RssSummary(before, max(mib for _, mib in samples), after, growth)


class Goals(NamedTuple):
    ttft_p99_ratio: float | None
    itl_p99_ratio: float | None
    rss_growth: float | None
    latency_met: bool
    rss_met: bool

    @property
    def met(self) -> bool:
        return self.latency_met and self.rss_met


def evaluate(baseline: dict[str, Any], hostile: dict[str, Any], rss: RssSummary, max_ratio: float = 1.2,
             rss_tolerance: float = 0.10) -> Goals:
    """The goals from the pooled baseline and hostile summaries (``pooled``) and the RSS summary. A goal whose
    numbers are missing (no requests finished, no samples) is not met."""
    ttft = ratio(hostile["ttft_ms"]["p99"], baseline["ttft_ms"]["p99"])
    itl = ratio(hostile["itl_ms"]["p99"], baseline["itl_ms"]["p99"])
    latency_met = (ttft is not None and itl is not None and ttft <= max_ratio and itl <= max_ratio
                   and hostile["num_errors"] == 0 and baseline["num_errors"] == 0)
    rss_met = rss.growth is not None and rss.growth <= rss_tolerance
    return Goals(ttft, itl, rss.growth, latency_met, rss_met)


def seconds_summary(values: Sequence[float]) -> dict[str, float | int | None]:
    """{n, min, p50, max} of durations in seconds (slowloris lifetimes, answer latencies)."""
    if not values:
        return {"n": 0, "min": None, "p50": None, "max": None}
    return {"n": len(values), "min": round(min(values), 3), "p50": round(percentile(values, 0.5) or 0.0, 3),
            "max": round(max(values), 3)}


LAG = "splitserve_frontend_event_loop_lag_seconds"


def loop_lag_over(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Event-loop lag probes between two parsed /metrics scrapes (``server.parse_prometheus``): how many, and
    how many were later than each bucket bound (``{"0.05": 3}``: 3 probes fired over 50 ms late)."""
    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    count = delta(f"{LAG}_count")
    over: dict[str, int] = {}
    for key in after:
        if key.startswith(f"{LAG}_bucket{{") and 'le="+Inf"' not in key:
            le = key.split('le="', 1)[1].rstrip('"}')
            over[le] = int(count - delta(key))
    return {"num_probes": int(count), "sum_s": round(delta(f"{LAG}_sum"), 4),
            "probes_over_s": dict(sorted(over.items(), key=lambda kv: float(kv[0])))}
