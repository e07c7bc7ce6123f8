"""Metric math, exact on synthetic timings."""

from __future__ import annotations

import pytest

from bench.lib.metrics import (
    RequestTiming,
    aggregate,
    attribute_tokens,
    cached_share,
    itl_gaps,
    meets_slo,
    parse_slo,
    percentile,
    summarize,
    token_times,
    tpot,
)


def test_percentile_linear_interpolation():
    v = [4.0, 1.0, 3.0, 2.0]  # sorted 1 2 3 4
    assert percentile(v, 0.0) == 1.0
    assert percentile(v, 1.0) == 4.0
    assert percentile(v, 0.5) == 2.5  # pos 1.5
    assert percentile(v, 0.9) == pytest.approx(3.7)  # pos 2.7
    assert percentile(list(range(101)), 0.99) == 99.0
    assert percentile([7.0], 0.99) == 7.0
    assert percentile([], 0.5) is None
    with pytest.raises(ValueError):
        percentile([1.0], 1.5)


def test_summarize_scales_and_rounds():
    s = summarize([0.001, 0.002, 0.003, 0.004], scale=1e3)
    assert s == {"n": 4, "mean": 2.5, "p50": 2.5, "p90": 3.7, "p99": 3.97, "min": 1.0, "max": 4.0}
    assert summarize([])["p50"] is None and summarize([])["n"] == 0


def test_multi_token_chunk_counts_as_tokens_arriving_at_once():
    # chunks at 0.1 s (1 token), 0.3 s (3 tokens), 0.4 s (1 token): 5 tokens, 4 gaps
    times, tokens = [0.1, 0.3, 0.4], [1, 3, 1]
    assert token_times(times, tokens) == [0.1, 0.3, 0.3, 0.3, 0.4]
    assert itl_gaps(times, tokens) == pytest.approx([0.2, 0.0, 0.0, 0.1])
    assert sum(itl_gaps(times, tokens)) == pytest.approx(0.4 - 0.1)
    # a first chunk of 2 tokens: its second token has gap 0
    assert itl_gaps([0.5, 0.6], [2, 1]) == pytest.approx([0.0, 0.1])
    with pytest.raises(ValueError):
        token_times([0.1], [1, 1])


def test_tpot():
    assert tpot(1.1, 0.1, 11) == pytest.approx(0.1)
    assert tpot(1.0, 0.2, 1) is None
    assert tpot(1.0, 0.2, 2) == pytest.approx(0.8)


def test_attribute_tokens_reconciles_with_usage():
    assert attribute_tokens([1, 1, 1], 5) == [1, 1, 3]  # 2 unseen tokens arrive with the last chunk
    assert attribute_tokens([1, 1], 2) == [1, 1]
    assert attribute_tokens([1, 1, 1], 2) == [1, 1, 1]  # more chunks than tokens: kept
    assert attribute_tokens([1, 1], None) == [1, 1]
    assert attribute_tokens([], 3) == []


def _req(ttft, gaps, e2e, ok=True, prompt=100, cached=0, tokens=None):
    times = [ttft]
    for g in gaps:
        times.append(times[-1] + g)
    chunk_tokens = tokens or [1] * len(times)
    return RequestTiming(ok=ok, e2e_s=e2e, chunk_times_s=times, chunk_tokens=chunk_tokens, prompt_tokens=prompt,
                         completion_tokens=sum(chunk_tokens), cached_tokens=cached, error="" if ok else "HTTP 503: x")


def test_request_timing_values():
    r = _req(0.1, [0.02, 0.03, 0.05], e2e=0.21)
    assert r.ttft_s == 0.1
    assert r.num_output_tokens == 4
    assert r.itl_s() == pytest.approx([0.02, 0.03, 0.05])
    assert r.tpot_s() == pytest.approx((0.21 - 0.1) / 3)


def test_slo_and_goodput_exact():
    a = _req(0.100, [0.010, 0.010], e2e=0.125, prompt=100, cached=50)   # ttft 100, max itl 10, tpot 12.5
    b = _req(0.300, [0.010, 0.010], e2e=0.325, prompt=100, cached=0)    # ttft 300: misses ttft 200
    c = _req(0.050, [0.010, 0.060], e2e=0.125, prompt=200, cached=100)  # max itl 60: misses itl 50
    d = _req(0.050, [], e2e=0.060, ok=False)                             # failed
    slo = parse_slo("ttft_ms=200, itl_ms=50")
    assert slo == {"ttft_ms": 200.0, "itl_ms": 50.0}
    assert [meets_slo(r, slo) for r in (a, b, c, d)] == [True, False, False, False]
    assert meets_slo(c, {"tpot_ms": 40.0})  # tpot (125-50)/2 = 37.5
    assert not meets_slo(c, {"tpot_ms": 37.0})
    assert meets_slo(_req(0.05, [], e2e=0.06), {"itl_ms": 1.0, "tpot_ms": 1.0})  # 1 token: no ITL/TPOT
    with pytest.raises(ValueError):
        parse_slo("latency=3")
    with pytest.raises(ValueError):
        meets_slo(a, {"bogus_ms": 1.0})

    res = aggregate([a, b, c, d], duration_s=2.0, slo=slo)
    assert res["num_requests"] == 4 and res["num_ok"] == 3 and res["num_errors"] == 1
    assert res["error_kinds"] == {"HTTP 503": 1}
    assert res["requests_per_s"] == 1.5
    assert res["output_tokens"] == 9 and res["output_tokens_per_s"] == 4.5
    assert res["prompt_tokens"] == 400 and res["total_tokens_per_s"] == 204.5
    assert res["goodput_requests_per_s"] == 0.5
    assert res["slo_attainment"] == 0.25
    assert res["cached_tokens"] == 150 and res["cached_token_share"] == 0.375
    assert res["ttft_ms"]["p50"] == 100.0 and res["ttft_ms"]["max"] == 300.0 and res["ttft_ms"]["n"] == 3
    # pooled gaps (ms): 10 10 10 10 10 60
    assert res["itl_ms"]["n"] == 6 and res["itl_ms"]["p50"] == 10.0 and res["itl_ms"]["max"] == 60.0
    assert res["itl_ms"]["mean"] == pytest.approx(110 / 6, abs=1e-4)
    assert res["tpot_ms"]["p50"] == 12.5
    assert res["e2e_ms"]["p50"] == 125.0
    assert aggregate([a], 1.0)["goodput_requests_per_s"] is None  # no SLO given
    assert aggregate([], 0.0)["requests_per_s"] == 0.0


def test_cached_share():
    assert cached_share([_req(0.1, [], 0.1, prompt=100, cached=25), _req(0.1, [], 0.1, prompt=300, cached=75)]) == 0.25
    assert cached_share([]) is None
