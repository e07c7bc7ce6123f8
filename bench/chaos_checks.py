"""Pure parts of bench/chaos.py: the seeded fault schedule and the invariants, each a function of plain data.

Fault kinds (``KINDS``): ``kill9`` (SIGKILL, then restarted with the same command, as `up` restarts a crashed
child), ``stop5`` (SIGSTOP for ``STOP_S``, then SIGCONT: a hung process), ``link3`` (the service's host's link down
for ``LINK_DOWN_S``: a host carries several services, so the partition hits all of them), ``hog`` (a busy process
pinned to the service's core for ``HOG_S``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

KINDS = ("kill9", "stop5", "link3", "hog")
STOP_S, LINK_DOWN_S, HOG_S = 5.0, 3.0, 5.0
RSS_DRIFT_MAX = 0.10  # fraction of a process's RSS after warm-up


@dataclass(frozen=True)
class Fault:
    at_s: float  # from the start of the chaos phase
    kind: str
    target: str  # service name


def schedule(seed: int, duration_s: float, targets: list[str], min_gap_s: float = 10.0,
             max_gap_s: float = 30.0) -> list[Fault]:
    """Faults every ``min_gap_s``-``max_gap_s`` (uniform) until ``duration_s``, each a random kind on a random
    target; the same seed, the same list."""
    rng = random.Random(seed)
    out: list[Fault] = []
    t = rng.uniform(min_gap_s, max_gap_s)
    while t < duration_s:
        out.append(Fault(round(t, 3), rng.choice(KINDS), rng.choice(targets)))
        t += rng.uniform(min_gap_s, max_gap_s)
    return out


@dataclass(frozen=True)
class Outcome:
    """One request as the client saw it."""

    index: int
    frontend: str
    start_s: float  # same clock as the kill times
    end_s: float
    text: str | None  # None: it ended with an error
    error: str = ""
    timed_out: bool = False


def verdict(outcome: Outcome, expected_text: str, frontend_down: list[tuple[float, float]],
            slack_s: float = 1.0) -> str:
    """``ok`` (output equal to the fault-free run's), ``clean_error`` (an error on its frontend while that one was
    killed: between the kill and the restarted frontend answering again, ``frontend_down`` (from_s, to_s)), or
    what makes it lost: ``mismatch``, ``timeout``, ``error_without_frontend_kill``."""
    if outcome.text is not None:
        return "ok" if outcome.text == expected_text else "mismatch"
    if outcome.timed_out:
        return "timeout"
    if any(lo - slack_s <= outcome.end_s and outcome.start_s <= hi + slack_s for lo, hi in frontend_down):
        return "clean_error"
    return "error_without_frontend_kill"


def blocks_leaked(free_blocks: dict[str, int], num_blocks: int) -> dict[str, int]:
    """Blocks not free per worker once the load is gone, only workers with any."""
    return {wid: num_blocks - free for wid, free in free_blocks.items() if free != num_blocks}


def rss_drift(start_mib: dict[str, float], end_mib: dict[str, float]) -> dict[str, float]:
    """(end - start) / start per process present at both ends."""
    return {name: round((end_mib[name] - start_mib[name]) / start_mib[name], 4)
            for name in start_mib if name in end_mib and start_mib[name] > 0}


def replicas_agree(views: dict[str, set[str]]) -> bool:
    """Every router replica lists the same workers (and at least one replica answered)."""
    vals = list(views.values())
    return bool(vals) and all(v == vals[0] for v in vals)
