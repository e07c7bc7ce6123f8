"""Parsing SLOs and workloads."""

from __future__ import annotations

import pytest

from services.planner.workload import Slo, Workload


def test_slo_and_workload_parsing() -> None:
    assert Slo.parse("ttft_ms=500, itl_ms=50") == Slo(500, 50)
    for bad in ("ttft_ms=500", "ttft=1,itl_ms=2", "ttft_ms500,itl_ms=2"):
        with pytest.raises(ValueError):
            Slo.parse(bad)
    with pytest.raises(ValueError):
        Workload.of(100, 10)  # neither rate nor concurrency
    with pytest.raises(ValueError):
        Workload.of(100, 10, rate=1, concurrency=2)
    with pytest.raises(ValueError):
        Workload.of(0, 10, rate=1)
