"""The planner's pool sizing, exactly, on hand-made timing models.

Mostly ``P(n) = n / 10`` ms (prefill) and ``D(b) = 10 + b`` ms (decode step, context-free), so every
expected number below is worked by hand in the comments.
"""

from __future__ import annotations

import pytest

from common.timing import TimingModel
from services.planner.plan import plan, prefill_workers_for_quantile
from services.planner.workload import PlanOptions, Slo, Workload

TM = TimingModel(prefill_coeffs_s=(0.0, 1e-4, 0.0), decode_base_s=0.010, decode_per_seq_s=0.001,
                 decode_per_kv_token_s=0.0)


# (isl, osl, rate, ttft_ms, itl_ms) -> (prefill workers, decode workers, local threshold, aggregated workers,
#                                      aggregated bound_by, mode, reasons)
TABLE = [
    # Prefill: S = 100 ms, slack 200 ms -> lam_max = 0.4 / (0.01 + 0.04) = 8/s -> ceil(20/8) = 3.
    # Decode: b* = 42, C = 20 * 100 * 0.052 = 104 -> ceil(104/42) = 3; b = 20, ITL 30 -> T = 220.
    # Aggregated: rho = 2/n, b = 20/(n-4): n = 5 -> b 20, ITL 30/0.6 = 50 ms, TTFT 100 + 33.3 + 30.
    ((1000, 100, 20, 300, 52.05), (3, 3, 220, 5, ("capacity", "ttft", "itl"), "aggregated", ("fewer_workers",))),
    # Tight ITL: b* = 10, C = 40 -> 4 decode workers (b = 10, ITL 20); T = 0.
    # Aggregated: ITL = (10 + 20/(n-4)) / (1 - 2/n): n = 7 -> 23.3 ms, n = 8 -> 20 ms.
    ((1000, 100, 20, 300, 20.05), (3, 4, 0, 8, ("itl",), "disaggregated", ("fewer_workers", "tight_itl"))),
    # Loose ITL: T = 1700 >= ISL, every prompt local (prefill-light): the decode pool is the aggregated plan,
    # bound by TTFT = 100 + Wq + D(b): n = 8 -> 131.7 ms, n = 9 -> 128.3 ms.
    ((1000, 100, 20, 130, 200.05), (0, 9, 1700, 9, ("ttft",), "aggregated", ("prefill_light",))),
    # Tight TTFT, loose ITL: S = 300 ms, slack 150 -> lam_max 1.667/s -> 3 prefill + 1 decode (b 6.67).
    # Aggregated n = 3: rho 0.4, b = 2.857, TTFT = 300 + 100 + 2 chunks * 12.857 = 425.7 ms; n = 2: Wq 225.
    ((3000, 100, 4, 450, 100.05), (3, 1, 833, 3, ("ttft",), "aggregated", ("fewer_workers", "tight_ttft_loose_itl"))),
]


@pytest.mark.parametrize(("args", "expected"), TABLE)
def test_plan_table(args: tuple, expected: tuple) -> None:
    isl, osl, rate, ttft, itl = args
    p = plan(TM, Workload.of(isl, osl, rate=rate), Slo(ttft, itl))
    d, a = p.disaggregated, p.aggregated
    assert d.prefill is not None and d.decode is not None
    got = (d.prefill.workers, d.decode.workers, d.local_prefill_max_tokens, a.workers, a.bound_by,
           p.decision.mode, p.decision.reasons)
    assert got == expected
    assert p.decision.workers_disaggregated == d.prefill.workers + d.decode.workers
    assert p.decision.workers_aggregated == a.workers
    assert d.ttft_ms is not None and d.ttft_ms <= ttft and d.itl_ms is not None and d.itl_ms <= itl
    assert a.ttft_ms is not None and a.ttft_ms <= ttft and a.itl_ms is not None and a.itl_ms <= itl


def test_plan_predictions_first_row() -> None:
    p = plan(TM, Workload.of(1000, 100, rate=20), Slo(300, 52.05), PlanOptions(kv_bytes_per_token=34_000))
    d, a = p.disaggregated, p.aggregated
    assert d.prefill is not None and d.decode is not None
    assert d.prefill.prefill_ms == pytest.approx(100)
    assert d.prefill.wait_ms == pytest.approx(100)  # M/D/1 at rho 2/3
    assert d.prefill.ttft_ms == pytest.approx(200)
    assert d.prefill.utilization == pytest.approx(2 / 3)
    assert d.prefill.max_rate_per_worker == pytest.approx(8)
    assert d.prefill.max_tokens_per_s_per_worker == pytest.approx(8000)
    assert d.decode.max_batch_within_itl == 42
    assert d.decode.step_ms_at_max_batch == pytest.approx(52)
    assert d.decode.concurrency == pytest.approx(104)
    assert d.decode.batch == pytest.approx(20)
    assert d.decode.itl_ms == pytest.approx(30)
    assert d.decode.max_rate_per_worker == pytest.approx(42 / (100 * 0.052))
    assert d.total_workers == 6
    assert d.goodput_rps_per_worker == pytest.approx(20 / 6)
    assert d.output_tokens_per_s_per_worker == pytest.approx(2000 / 6)
    assert d.kv_transfer_ms == pytest.approx(0.5 + 34_000 * 1000 / 3.4e9 * 1e3)  # 10.5 ms
    assert a.ttft_ms == pytest.approx(100 + 100 / 3 + 30)
    assert a.itl_ms == pytest.approx(50)
    assert a.itl_max_ms == pytest.approx(30 + 100)  # a step carrying the whole 1000-token prompt
    assert a.batch == pytest.approx(20)
    assert a.prefill_utilization == pytest.approx(0.4)
    assert a.goodput_rps_per_worker == pytest.approx(4)


def test_isl_distribution_uses_pollaczek_khinchine() -> None:
    # ISL {500, 1500}: E[S] = 0.1, E[S^2] = 0.0125 -> lam_max = 0.4 / 0.0525 -> ceil(20 / 7.619) = 3;
    # Wq at lam 20/3 = 6.667 * 0.0125 / (2/3) = 0.125 s -> TTFT 225 ms (200 ms when ISL is fixed).
    p = plan(TM, Workload.of((500, 1500), 100, rate=20), Slo(300, 52.05))
    d = p.disaggregated
    assert d.prefill is not None
    assert d.prefill.workers == 3
    assert d.prefill.max_rate_per_worker == pytest.approx(0.4 / 0.0525)
    assert d.prefill.ttft_ms == pytest.approx(225)


def test_short_prompts_prefill_locally_and_stall_decode() -> None:
    # ISL {100, 1900}, T = 220: half local (P = 10 ms), half remote (S = 190 ms).
    # Prefill: slack 110 ms -> lam_max = 0.22 / (0.0361 + 0.0418) -> ceil(10 / 2.824) = 4.
    # Decode n = 3: rho_local = 20/3 * 0.5 * 0.01 = 1/30; K = 666.7 / (29/30) = 689.66;
    # b = 6.8966 / 0.31034 = 200/9, ITL = (10 + 200/9) / (29/30) = 100/3 ms.
    p = plan(TM, Workload.of((100, 1900), 100, rate=20), Slo(300, 52.05))
    d = p.disaggregated
    assert d.prefill is not None and d.decode is not None
    assert d.local_prefill_max_tokens == 220
    assert d.prefill.remote_fraction == 0.5
    assert d.prefill.workers == 4
    assert d.decode.workers == 3
    assert d.decode.local_prefill_utilization == pytest.approx(1 / 30)
    assert d.decode.batch == pytest.approx(200 / 9)
    assert d.decode.itl_ms == pytest.approx(100 / 3)
    # Local TTFT: 10 ms + M/D/1 wait (lam 10/3, S 10 ms) + one step of 32.2 ms.
    wait_ms = (10 / 3) * 1e-4 / (2 * (1 - 1 / 30)) * 1e3
    assert d.decode.local_ttft_ms == pytest.approx(10 + wait_ms + 10 + 200 / 9)


@pytest.mark.parametrize(("args", "disagg_reason", "agg_reason", "mode"), [
    ((5000, 100, 1, 400, 100), "prefill_exceeds_ttft", "prefill_exceeds_ttft", "infeasible"),
    ((1000, 100, 1, 400, 10.5), "decode_step_exceeds_itl", "decode_step_exceeds_itl", "infeasible"),
])
def test_infeasible(args: tuple, disagg_reason: str, agg_reason: str, mode: str) -> None:
    isl, osl, rate, ttft, itl = args
    p = plan(TM, Workload.of(isl, osl, rate=rate), Slo(ttft, itl))
    assert (p.disaggregated.feasible, p.disaggregated.infeasible_reason) == (False, disagg_reason)
    assert (p.aggregated.feasible, p.aggregated.infeasible_reason) == (False, agg_reason)
    assert p.decision.mode == mode and p.decision.reasons == ("both_infeasible",)


def test_plan_is_json_ready() -> None:
    import json

    d = plan(TM, Workload.of(1000, 100, rate=20), Slo(300, 52.05)).to_dict()
    assert json.loads(json.dumps(d))["decision"]["mode"] == "aggregated"


def test_prefill_workers_for_quantile() -> None:
    timing = TimingModel(prefill_coeffs_s=(0.0, 0.001))  # 2,000 tokens: 2 s
    # 0.6 req/s of 2 s prompts: TTFT p90 = 2 s + wait p90 = 6.5 s (2 workers), 4.3 s (3), 3.6 s (4).
    assert prefill_workers_for_quantile(timing, [2000], 0.6, 4.0, 0.9, 8) == 4
    assert prefill_workers_for_quantile(timing, [2000], 0.6, 6.0, 0.9, 8) == 3
    assert prefill_workers_for_quantile(timing, [2000], 0.0, 4.0, 0.9, 8) == 0
    assert prefill_workers_for_quantile(timing, [2000], 0.6, 1.5, 0.9, 8) is None
