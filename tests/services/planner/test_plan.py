"""The planner's math, exactly, on hand-made timing models.

Mostly ``P(n) = n / 10`` ms (prefill) and ``D(b) = 10 + b`` ms (decode step, context-free), so every
expected number below is worked by hand in the comments.
"""

from __future__ import annotations

import math

import pytest

from services.planner.plan import (
    PlanOptions,
    Slo,
    Workload,
    ceil_div,
    decode_step_s,
    local_prefill_threshold,
    max_batch_within,
    mg1_max_rate,
    mg1_wait_s,
    options_from_profile,
    plan,
    request_rate,
    smallest_workers,
    steady_batch,
)
from common.timing import TimingModel

TM = TimingModel(prefill_coeffs_s=(0.0, 1e-4, 0.0), decode_base_s=0.010, decode_per_seq_s=0.001,
                 decode_per_kv_token_s=0.0)


# ------------------------------------------------------------------------------------------ formulas


def test_mg1_wait_is_md1_for_fixed_service_and_inf_when_saturated() -> None:
    # M/D/1: rho S / (2 (1 - rho)); S = 0.1, lam = 6.667 -> rho = 2/3 -> 0.1 s.
    assert mg1_wait_s(20 / 3, 0.1, 0.01) == pytest.approx(0.1)
    assert mg1_wait_s(0.0, 0.1, 0.01) == 0.0
    assert mg1_wait_s(10.0, 0.1, 0.01) == math.inf
    # Variance adds wait (P-K): E[S^2] = 0.0125 instead of 0.01 -> 0.125 s.
    assert mg1_wait_s(20 / 3, 0.1, 0.0125) == pytest.approx(0.125)


def test_mg1_max_rate_inverts_the_wait() -> None:
    lam = mg1_max_rate(0.1, 0.01, 0.2)
    assert lam == pytest.approx(8.0)  # 2 * 0.2 / (0.01 + 2 * 0.2 * 0.1)
    assert mg1_wait_s(lam, 0.1, 0.01) == pytest.approx(0.2)
    assert mg1_max_rate(0.1, 0.01, -0.01) == 0.0


def test_ceil_div_forgives_float_noise() -> None:
    assert ceil_div(0.1 * 3, 0.1) == 3
    assert ceil_div(3.0001, 1) == 4
    assert ceil_div(0, 5) == 0


def test_decode_step_uses_batch_times_context_and_counts_a_partial_batch_as_one() -> None:
    tm = TimingModel(decode_base_s=0.010, decode_per_seq_s=0.001, decode_per_kv_token_s=1e-6)
    assert decode_step_s(tm, 4, 1000) == pytest.approx(0.010 + 0.004 + 0.004)
    assert decode_step_s(tm, 0.3, 1000) == decode_step_s(tm, 1, 1000)


@pytest.mark.parametrize(("itl_s", "context", "max_batch", "expected"), [
    (0.05205, 0, 64, 42),  # 10 + 42 = 52 <= 52.05 < 53
    (0.05, 0, 64, 40),  # boundary counts
    (0.2, 0, 64, 64),  # capped
    (0.0105, 0, 64, 0),  # batch 1 is 11 ms
])
def test_max_batch_within_itl(itl_s: float, context: float, max_batch: int, expected: int) -> None:
    assert max_batch_within(TM, context, itl_s, max_batch) == expected


def test_max_batch_within_itl_sees_the_context() -> None:
    # ISL 900, OSL 200 -> context 1000: D(b) = 10 + b + b * 1000 * 1e-3 = 10 + 2b ms -> b* = 20 at 50.05 ms.
    tm = TimingModel(decode_base_s=0.010, decode_per_seq_s=0.001, decode_per_kv_token_s=1e-6)
    ctx = Workload.of(900, 200, rate=1.0).context_mean
    assert ctx == 1000
    assert max_batch_within(tm, ctx, 0.05005, 64) == 20


def test_steady_batch_is_the_little_fixed_point() -> None:
    # b = lam * osl * (0.010 + 0.001 b): lam 20/3, osl 100 -> b = 6.667 + 0.6667 b -> 20.
    assert steady_batch(TM, 0, 20 / 3, 100) == pytest.approx(20.0)
    # With a stall rho: K = lam osl / (1 - rho); b = K 0.01 / (1 - K 0.001).
    assert steady_batch(TM, 0, 4 / 3, 100, stall=0.4) == pytest.approx(2.2222222 / 0.7777778)
    # K * 0.001 >= 1: no steady batch.
    assert steady_batch(TM, 0, 10, 100) == math.inf
    assert steady_batch(TM, 0, 1, 100, stall=1.0) == math.inf


def test_local_prefill_threshold() -> None:
    # slack 52.05 - 30 = 22.05 ms -> P(220) = 22.0 ms fits, P(221) = 22.1 does not.
    assert local_prefill_threshold(TM, 0.05205, 0.030, 2048) == 220
    assert local_prefill_threshold(TM, 0.5, 0.030, 2048) == 2048  # capped at the chunk
    assert local_prefill_threshold(TM, 0.030, 0.030, 2048) == 0


def test_smallest_workers() -> None:
    assert smallest_workers(lambda n: n >= 37, 1, 1000) == 37
    assert smallest_workers(lambda n: n >= 3, 5, 1000) == 5
    assert smallest_workers(lambda n: n >= 37, 1, 30) is None


def test_concurrency_becomes_a_rate() -> None:
    # N = 40, b* = 42 -> batch 40, D = 50 ms; lam = 40 / (0.1 + 100 * 0.05) = 40 / 5.1.
    workload = Workload.of(1000, 100, concurrency=40)
    assert request_rate(TM, workload, Slo(300, 52.05), PlanOptions()) == pytest.approx(40 / 5.1)


# ------------------------------------------------------------------------------------------- plans

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


def test_options_from_profile() -> None:
    doc = {"conditions": {"kv_bytes_per_token": 4096}, "decode": [{"batch": 1}, {"batch": 32}]}
    assert options_from_profile(doc) == PlanOptions(max_batch=32, kv_bytes_per_token=4096)
    assert options_from_profile(doc, max_batch=8, chunk_tokens=None).max_batch == 8


def test_mg1_wait_quantile() -> None:
    from services.planner.plan import mg1_wait_quantile_s, mg1_wait_s

    # rho = 0.5, deterministic 1 s service: Wq = 0.5 s; waiters' mean 1 s; p90 = ln(0.5 / 0.1) = 1.609 s.
    assert mg1_wait_quantile_s(0.5, 1.0, 1.0, 0.9) == pytest.approx(math.log(5.0))
    assert mg1_wait_s(0.5, 1.0, 1.0) == pytest.approx(0.5)
    assert mg1_wait_quantile_s(0.05, 1.0, 1.0, 0.9) == 0.0  # 95% never wait
    assert mg1_wait_quantile_s(1.0, 1.0, 1.0, 0.9) == math.inf


def test_prefill_workers_for_quantile() -> None:
    from services.planner.plan import prefill_workers_for_quantile
    from common.timing import TimingModel

    timing = TimingModel(prefill_coeffs_s=(0.0, 0.001))  # 2,000 tokens: 2 s
    # 0.6 req/s of 2 s prompts: TTFT p90 = 2 s + wait p90 = 6.5 s (2 workers), 4.3 s (3), 3.6 s (4).
    assert prefill_workers_for_quantile(timing, [2000], 0.6, 4.0, 0.9, 8) == 4
    assert prefill_workers_for_quantile(timing, [2000], 0.6, 6.0, 0.9, 8) == 3
    assert prefill_workers_for_quantile(timing, [2000], 0.0, 4.0, 0.9, 8) == 0
    assert prefill_workers_for_quantile(timing, [2000], 0.6, 1.5, 0.9, 8) is None
