"""The plan as a terminal table."""

from __future__ import annotations

from common.timing import TimingModel
from services.planner.display import format_plan
from services.planner.plan import plan
from services.planner.workload import Slo, Workload

TM = TimingModel(prefill_coeffs_s=(0.0, 1e-4, 0.0), decode_base_s=0.010, decode_per_seq_s=0.001,
                 decode_per_kv_token_s=0.0)


def test_format_plan_shows_both_modes_and_the_recommendation() -> None:
    # The first row of test_plan's table: 3P + 3D disaggregated, 5 aggregated, aggregated recommended.
    text = format_plan(plan(TM, Workload.of(1000, 100, rate=20), Slo(300, 52.05)))
    lines = text.splitlines()
    assert lines[0].startswith("workload: rate 20 req/s, ISL 1000, OSL 100")
    workers = next(line for line in lines if line.startswith("workers"))
    assert "3P + 3D = 6" in workers and workers.rstrip().endswith("5")
    assert next(line for line in lines if line.startswith("local prefill")).split()[-2:] == ["220", "all"]
    assert "recommendation: aggregated (fewer_workers)" in text
    assert lines[-1] == "aggregated is bound by: capacity, ttft, itl"


def test_format_plan_names_an_infeasible_mode() -> None:
    text = format_plan(plan(TM, Workload.of(5000, 100, rate=1), Slo(400, 100)))
    assert "infeasible (prefill_exceeds_ttft)" in text
    assert "recommendation: infeasible (both_infeasible)" in text
