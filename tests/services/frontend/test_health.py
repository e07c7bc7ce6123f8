"""/health's judgement from the router's worker list (services/frontend/health.py)."""

from __future__ import annotations

import pytest

from common.protocol import WorkerInfo, WorkerList, WorkerLoad
from services.frontend.health import PoolCounts, count_pools, judge_health

BOTH = frozenset({"prefill", "decode"})


@pytest.mark.parametrize(("counts", "seen", "status", "http_status", "reasons"), [
    (PoolCounts(), frozenset(), "unavailable", 503, ("no decode-capable worker is serving",)),
    (PoolCounts(num_prefill=2), BOTH, "unavailable", 503, ("no decode-capable worker is serving",)),
    (PoolCounts(num_decode=1), frozenset({"decode"}), "ok", 200, ()),  # aggregated graph: no prefill pool ever
    (PoolCounts(num_prefill=1, num_decode=1), BOTH, "ok", 200, ()),
    # The prefill pool went empty: served still (decode workers prefill), but say so.
    (PoolCounts(num_decode=1), BOTH, "degraded", 200, ("the prefill pool has no serving worker",)),
    (PoolCounts(num_prefill=1, num_decode=1, num_draining=1), BOTH, "degraded", 200, ("1 worker(s) draining",)),
    # One of several models lost its decode workers: the others are served, so 200, but not "ok".
    (PoolCounts(num_prefill=1, num_decode=1, models_without_decode=("b",)), BOTH, "degraded", 200,
     ("model 'b' has no decode-capable worker",)),
])
def test_judge_health(counts, seen, status, http_status, reasons) -> None:
    health = judge_health(counts, seen)
    assert (health.status, health.http_status, health.reasons) == (status, http_status, reasons)


def _info(worker_id: str, role: str, model: str = "m") -> WorkerInfo:
    return WorkerInfo(worker_id=worker_id, role=role, model=model, block_size=16, num_blocks=8,  # type: ignore[arg-type]
                      endpoint="tcp://127.0.0.1:1")


def test_count_pools_counts_serving_workers_of_this_model_and_draining_apart() -> None:
    workers = (_info("p0", "prefill"), _info("d0", "decode"), _info("b0", "both"), _info("d1", "decode"),
               _info("x0", "decode", model="other"))
    listed = WorkerList(request_id="r", workers=workers, loads=(WorkerLoad(),) * len(workers), draining=("d1",))
    counts = count_pools(listed, "m")
    assert counts == PoolCounts(num_prefill=1, num_decode=2, num_draining=1)
    assert counts.pools == BOTH


def test_count_pools_names_the_models_with_no_decode_worker() -> None:
    workers = (_info("d0", "decode", model="a"), _info("p1", "prefill", model="b"), _info("d1", "decode", model="b"))
    listed = WorkerList(request_id="r", workers=workers, loads=(WorkerLoad(),) * 3, draining=("d1",))
    assert count_pools(listed, ("a", "b", "c")).models_without_decode == ("b", "c")
    assert count_pools(listed, ("b",)).models_without_decode == ()  # no decode at all: unavailable says it
