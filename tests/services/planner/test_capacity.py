"""One worker's capacity from a timing model, on hand-made models.

Mostly ``P(n) = n / 10`` ms (prefill) and ``D(b) = 10 + b`` ms (decode step, context-free), so every
expected number below is worked by hand in the comments.
"""

from __future__ import annotations

import math

import pytest

from common.timing import TimingModel
from services.planner.capacity import (
    decode_step_s,
    local_prefill_threshold,
    max_batch_within,
    request_rate,
    steady_batch,
)
from services.planner.workload import PlanOptions, Slo, Workload

TM = TimingModel(prefill_coeffs_s=(0.0, 1e-4, 0.0), decode_base_s=0.010, decode_per_seq_s=0.001,
                 decode_per_kv_token_s=0.0)


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


def test_concurrency_becomes_a_rate() -> None:
    # N = 40, b* = 42 -> batch 40, D = 50 ms; lam = 40 / (0.1 + 100 * 0.05) = 40 / 5.1.
    workload = Workload.of(1000, 100, concurrency=40)
    assert request_rate(TM, workload, Slo(300, 52.05), PlanOptions()) == pytest.approx(40 / 5.1)
