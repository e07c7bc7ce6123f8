"""planner -> orchestrators (PUB): how many workers each pool should have."""

from __future__ import annotations

from common.protocol.base import Msg, Role

# ------------------------------------------------------------------------------ planner -> orchestrators (PUB)


class ScaleRequest(Msg, frozen=True):
    """The planner wants ``pool`` to have ``target`` workers (published; any orchestrator may act on it).

    Idempotent: the latest request per pool wins, so an orchestrator that missed some only acts on the last.
    Scale-down means drain: SIGTERM a worker of that pool (it finishes its requests, then exits).
    """

    seq: int
    pool: Role
    current: int
    target: int
    # Why, as data: {"signal": "ttft_p90_ms", "observed": 812.0, "limit": 500.0, ...} rendered to text.
    reason: str = ""
    # Seconds since the epoch when decided (orchestrators ignore stale requests after a restart).
    time_s: float = 0.0
