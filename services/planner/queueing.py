"""Queueing formulas of the plan (M/G/1 waits, Pollaczek-Khinchine) and the search for the fewest workers.

Pure numbers: seconds and requests/s, nothing about engines (``services.planner.capacity`` brings those).
"""

from __future__ import annotations

import math
from collections.abc import Callable

# Relative slack for float noise in comparisons (a boundary that is met exactly must count as met).
EPS = 1e-9


def mg1_wait_s(arrival_rate: float, mean_s: float, second_moment_s2: float) -> float:
    """Pollaczek-Khinchine mean wait of an M/G/1 queue; inf when saturated."""
    if arrival_rate <= 0:
        return 0.0
    rho = arrival_rate * mean_s
    if rho >= 1:
        return math.inf
    return arrival_rate * second_moment_s2 / (2 * (1 - rho))


def mg1_max_rate(mean_s: float, second_moment_s2: float, max_wait_s: float) -> float:
    """Largest arrival rate whose M/G/1 mean wait is <= ``max_wait_s`` (0 when none is)."""
    if max_wait_s < 0 or mean_s <= 0 and second_moment_s2 <= 0:
        return 0.0 if max_wait_s < 0 else math.inf
    return 2 * max_wait_s / (second_moment_s2 + 2 * max_wait_s * mean_s)


def mg1_wait_quantile_s(arrival_rate: float, mean_s: float, second_moment_s2: float, q: float) -> float:
    """Approximate ``q``-quantile of the M/G/1 wait (the live planner's SLOs are p90s, not means).

    A request waits at all with probability ``rho``; the wait of those that do is taken as exponential with
    mean ``Wq / rho`` (Kingman's heavy-traffic tail). So the quantile is 0 while ``rho <= 1 - q``, else
    ``(Wq / rho) * ln(rho / (1 - q))``; inf when saturated.
    """
    rho = arrival_rate * mean_s
    if rho >= 1:
        return math.inf
    if rho <= 1 - q:
        return 0.0
    return mg1_wait_s(arrival_rate, mean_s, second_moment_s2) / rho * math.log(rho / (1 - q))


def ceil_div(x: float, y: float) -> int:
    """ceil(x / y), forgiving float noise (4.0000000001 -> 4)."""
    return max(0, math.ceil(x / y - EPS))


def smallest_workers(ok: Callable[[int], bool], lo: int, hi: int) -> int | None:
    """The smallest n in [lo, hi] with ok(n), for ok monotone in n (doubling, then bisection)."""
    lo = max(lo, 1)
    if lo > hi:
        return None
    if ok(lo):
        return lo
    step = 1
    bad = lo
    while True:
        cand = min(lo + step, hi)
        if ok(cand):
            good = cand
            break
        bad = cand
        if cand == hi:
            return None
        step *= 2
    while good - bad > 1:
        mid = (good + bad) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good
