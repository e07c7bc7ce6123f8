"""What one worker does, from the engine's ``TimingModel``: ``D(b)``, ``b*``, the steady batch, ``E[P(ISL)]``,
the local-prefill threshold, and a closed loop's request rate (the formulas in ``services.planner.plan``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from common.timing import TimingModel
from services.planner.queueing import EPS
from services.planner.workload import PlanOptions, Slo, Workload


def decode_step_s(timing: TimingModel, batch: float, context: float) -> float:
    """``D(b)``: one decode step of ``batch`` sequences of ``context`` tokens (a batch below 1 counts as 1)."""
    b = max(batch, 1.0)
    return timing.decode_s(b, b * context)  # type: ignore[arg-type]


def max_batch_within(timing: TimingModel, context: float, itl_s: float, max_batch: int) -> int:
    """``b*``: the largest batch in [1, max_batch] whose step meets ``itl_s``; 0 when batch 1 does not."""
    best = 0
    for b in range(1, max_batch + 1):
        if decode_step_s(timing, b, context) <= itl_s + EPS * itl_s:
            best = b
        else:
            break
    return best


def steady_batch(timing: TimingModel, context: float, rate_per_worker: float, osl: float,
                 stall: float = 0.0, limit: float = 1e7) -> float:
    """Mean decode batch ``b = rate * osl * D(b) / (1 - stall)`` (least fixed point); inf if none."""
    if stall >= 1:
        return math.inf
    b = 0.0
    for _ in range(100_000):
        nxt = rate_per_worker * osl * decode_step_s(timing, b, context) / (1 - stall)
        if nxt > limit:
            return math.inf
        if abs(nxt - b) <= 1e-13 * max(1.0, nxt):
            return nxt
        b = nxt
    return math.inf


def prefill_moments(timing: TimingModel, isl: Sequence[int]) -> tuple[float, float]:
    """E[P(ISL)] and E[P(ISL)^2] over equally weighted samples (0, 0 for none)."""
    if not isl:
        return 0.0, 0.0
    times = [timing.prefill_s(n) for n in isl]
    return sum(times) / len(times), sum(t * t for t in times) / len(times)


def local_prefill_threshold(timing: TimingModel, itl_s: float, step_s: float, max_tokens: int) -> int:
    """Largest ``n <= max_tokens`` with ``step_s + P(n) <= itl_s`` (P increasing); 0 if none."""
    slack = itl_s - step_s
    if slack <= 0:
        return 0
    lo, hi = 0, max_tokens
    if timing.prefill_s(hi) <= slack:
        return hi
    while hi - lo > 1:  # P(lo) <= slack < P(hi)
        mid = (lo + hi) // 2
        if timing.prefill_s(mid) <= slack:
            lo = mid
        else:
            hi = mid
    return lo


def request_rate(timing: TimingModel, workload: Workload, slo: Slo, options: PlanOptions) -> float:
    """Arrival rate: given, or a closed loop's ``N / (E[S] + E[OSL] * D(min(N, b*)))``."""
    if workload.rate is not None:
        return workload.rate
    assert workload.concurrency is not None
    ctx = workload.context_mean
    b_star = max(1, max_batch_within(timing, ctx, slo.itl_ms / 1e3, options.max_batch))
    batch = min(workload.concurrency, b_star)
    mean_s, _ = prefill_moments(timing, workload.isl)
    return workload.concurrency / (mean_s + workload.osl_mean * decode_step_s(timing, batch, ctx))
