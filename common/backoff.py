"""Retry delays: exponential, capped, with jitter.

Why jitter: after a router restart every worker and kvtier re-registers; without jitter they retry in lockstep
(0.1, 0.2, 0.4 s ...) and arrive as one burst each time. "Equal jitter": half the delay is fixed, half random, so
a retry never comes sooner than half the exponential step.
"""

from __future__ import annotations

import random
from collections.abc import Callable


def backoff_s(attempt: int, base_s: float, max_s: float, rand: Callable[[], float] = random.random) -> float:
    """Delay before retry ``attempt`` (1-based): ``min(base_s * 2**(attempt-1), max_s)``, then halved and the
    other half drawn uniformly (``rand()`` in [0, 1))."""
    step_s = min(base_s * 2 ** max(attempt - 1, 0), max_s)
    return step_s / 2 + step_s / 2 * rand()


class Backoff:
    """Successive delays for one retry loop; ``reset`` after a success."""

    def __init__(self, base_s: float, max_s: float, rand: Callable[[], float] = random.random) -> None:
        self.base_s, self.max_s, self._rand = base_s, max_s, rand
        self.attempt = 0

    def next_s(self) -> float:
        self.attempt += 1
        return backoff_s(self.attempt, self.base_s, self.max_s, self._rand)

    def reset(self) -> None:
        self.attempt = 0
