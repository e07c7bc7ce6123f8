"""What the frontend's /health says, from the router's worker list: a pure judgement, table-tested.

- ``unavailable`` (HTTP 503): no decode-capable worker serves this model; every request would wait, then fail.
- ``degraded`` (HTTP 200: requests are still served): a pool this frontend has seen serving is empty now (the
  prefill pool gone means every prompt prefills on decode workers, at decode streams' expense), one of its
  several models has no decode-capable worker (its requests fail; the others' are served), or listed workers
  are draining.
- ``ok`` (HTTP 200) otherwise.

Counts are of serving workers: a draining worker finishes what it holds and takes nothing new, so it is
counted apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from common.protocol import WorkerList

HealthStatus = Literal["ok", "degraded", "unavailable"]


@dataclass(frozen=True, slots=True)
class PoolCounts:
    num_prefill: int = 0
    num_decode: int = 0  # decode and aggregated ("both") workers: each can serve a whole request
    num_draining: int = 0
    # Served models with no decode-capable serving worker, when the frontend serves several.
    models_without_decode: tuple[str, ...] = ()

    @property
    def pools(self) -> frozenset[str]:
        """The pools that have a serving worker now."""
        return frozenset(p for p, n in (("prefill", self.num_prefill), ("decode", self.num_decode)) if n)


@dataclass(frozen=True, slots=True)
class Health:
    status: HealthStatus
    http_status: int
    reasons: tuple[str, ...] = ()


def count_pools(listed: WorkerList, models: str | tuple[str, ...]) -> PoolCounts:
    """The serving workers of ``models`` (one name or the frontend's several) by pool, and the draining ones."""
    models = (models,) if isinstance(models, str) else models
    draining = set(listed.draining)
    serving = [w for w in listed.workers if w.model in models and w.worker_id not in draining]
    decoding = {w.model for w in serving if w.role in ("decode", "both")}
    return PoolCounts(num_prefill=sum(w.role == "prefill" for w in serving),
                      num_decode=sum(w.role in ("decode", "both") for w in serving),
                      num_draining=sum(w.model in models and w.worker_id in draining for w in listed.workers),
                      models_without_decode=tuple(m for m in models if m not in decoding) if decoding else ())


def judge_health(counts: PoolCounts, pools_seen: frozenset[str]) -> Health:
    """``pools_seen``: the pools that had a serving worker at some earlier look (a graph without a prefill
    pool is not degraded for lacking one)."""
    if counts.num_decode == 0:
        return Health("unavailable", 503, ("no decode-capable worker is serving",))
    reasons = [f"the {pool} pool has no serving worker" for pool in sorted(pools_seen - counts.pools)]
    reasons += [f"model {m!r} has no decode-capable worker" for m in counts.models_without_decode]
    if counts.num_draining:
        reasons.append(f"{counts.num_draining} worker(s) draining")
    return Health("degraded" if reasons else "ok", 200, tuple(reasons))
