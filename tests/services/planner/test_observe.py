"""Frontend /metrics -> the planner's observation (exact)."""

from __future__ import annotations

import math

import pytest

from common.protocol import WorkerInfo, WorkerList, WorkerLoad
from services.frontend.metrics import FrontendMetrics
from services.planner.observe import (
    FrontendSnapshot,
    bucket_delta,
    merge,
    observe,
    parse_metrics,
    quantile,
    recent_arrivals,
)


@pytest.mark.parametrize("buckets, q, expected", [
    (((0.1, 0.0), (0.2, 10.0), (math.inf, 10.0)), 0.5, 0.15),
    (((0.1, 5.0), (0.2, 10.0), (math.inf, 10.0)), 0.9, 0.18),
    (((0.1, 10.0), (0.2, 10.0), (math.inf, 10.0)), 1.0, 0.1),
    (((0.1, 0.0), (0.2, 0.0), (math.inf, 4.0)), 0.9, 0.2),  # beyond the last bound: the last bound
    (((0.1, 0.0), (math.inf, 0.0)), 0.9, None),
    ((), 0.9, None),
])
def test_quantile_like_prometheus(buckets, q, expected) -> None:
    got = quantile(buckets, q)
    assert got == pytest.approx(expected) if expected is not None else got is None


def _frontend(ttfts: list[float], itls: list[float], num_prompt: int, num_output: int, inflight: int,
              isls: list[int] = ()) -> str:
    m = FrontendMetrics()
    for n in isls:
        m.arrival_prompt_tokens.observe(n)
    for t in ttfts:
        m.observe_ttft(t)
        m.e2e_seconds.observe(t + 1)
    for t in itls:
        m.observe_itl(t)
    m.prompt_tokens.inc(num_prompt)
    m.output_tokens.inc(num_output)
    m.inflight.set(inflight)
    return m.render().decode()


def test_observe_two_scrapes_of_two_frontends() -> None:
    before = merge([parse_metrics(_frontend([0.3] * 4, [0.02] * 10, 400, 40, 2, [100] * 6)),
                    parse_metrics(_frontend([], [], 0, 0, 0))])
    now = merge([parse_metrics(_frontend([0.3] * 4 + [0.9] * 10, [0.02] * 10 + [0.055] * 100, 400 + 20480, 40 + 640, 5,
                                         [100] * 6 + [4096] * 12)),
                 parse_metrics(_frontend([0.9] * 10, [0.055] * 100, 20480, 640, 1, [4096] * 12))])
    assert now.num_finished == 24 and now.inflight == 6
    info = lambda wid, role: WorkerInfo(worker_id=wid, role=role, model="m", block_size=32, num_blocks=100,  # noqa: E731
                                        endpoint="tcp://127.0.0.1:1")
    workers = WorkerList(request_id="r", workers=(info("p0", "prefill"), info("p1", "prefill"), info("d0", "decode"),
                                                  info("d1", "decode")),
                         loads=(WorkerLoad(num_waiting=3), WorkerLoad(num_waiting=1),
                                WorkerLoad(num_waiting=1, num_free_blocks=20, num_total_blocks=100),
                                WorkerLoad(num_waiting=9, num_free_blocks=0, num_total_blocks=100)),
                         draining=("d1",))
    obs = observe(before, now, 10.0, workers)
    assert obs.num_finished == 20
    # Rate and ISL from arrivals (24 new, 4,096 tokens each), OSL from the 20 that finished.
    assert obs.arrival_rate_rps == pytest.approx(24 / 10)
    assert (obs.isl_mean, obs.osl_mean) == (4096, 64)
    assert obs.isl_samples == (4096,) * 24
    # Every new TTFT is 0.9 s: inside the (0.75, 1.0] bucket, interpolated at rank 18 of 20.
    assert obs.ttft_p90_ms == pytest.approx(750 + 250 * 18 / 20)
    assert obs.itl_p90_ms == pytest.approx(50 + 10 * 180 / 200)
    # The draining decode worker is neither counted nor averaged.
    assert (obs.num_prefill, obs.num_decode) == (2, 1)
    assert (obs.prefill_waiting, obs.decode_waiting, obs.decode_kv_usage) == (2.0, 1.0, pytest.approx(0.8))


@pytest.mark.parametrize("buckets, max_samples, expected", [
    (((512.0, 2.0), (2048.0, 5.0), (math.inf, 6.0)), 100, (512, 512, 2048, 2048, 2048, 2048)),
    (((512.0, 200.0), (2048.0, 400.0), (math.inf, 400.0)), 4, (512, 512, 2048, 2048)),
    (((512.0, 0.0), (math.inf, 0.0)), 10, ()),
])
def test_bucket_samples(buckets, max_samples, expected) -> None:
    from services.planner.observe import bucket_samples

    assert bucket_samples(buckets, max_samples) == expected


def test_recent_arrivals_and_their_max_tokens() -> None:
    """Arrivals between two scrapes an interval apart, and the mean max_tokens of those that set one."""
    def scrape(isls: list[int], max_tokens: list[int]) -> FrontendSnapshot:
        m = FrontendMetrics()
        for n in isls:
            m.arrival_prompt_tokens.observe(n)
        for n in max_tokens:
            m.arrival_max_tokens.observe(n)
        return parse_metrics(m.render().decode())

    before = scrape([2048] * 3, [32] * 3)
    now = merge([scrape([2048] * 3 + [512] * 4, [32] * 3 + [512] * 3), scrape([], [])])
    assert (now.max_tokens_count, now.max_tokens_sum) == (6, 3 * 32 + 3 * 512)
    assert recent_arrivals(before, now, 2.0) == (2.0, 512.0)  # 4 arrived in 2 s, 3 of them set max_tokens
    assert recent_arrivals(now, now, 2.0) == (0.0, None)
    workers = WorkerList(request_id="r", workers=(), loads=())
    obs = observe(before, now, 20.0, workers, (before, 2.0))
    assert (obs.recent_arrival_rps, obs.recent_max_tokens) == (2.0, 512.0)
    assert observe(before, now, 20.0, workers).recent_max_tokens is None


def test_bucket_delta() -> None:
    assert bucket_delta(((0.1, 5.0), (math.inf, 9.0)), ((0.1, 2.0), (math.inf, 2.0))) == ((0.1, 3.0), (math.inf, 7.0))
