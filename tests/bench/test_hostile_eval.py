"""bench/lib/hostile_eval.py: phases, per-phase grouping, RSS summary, goal verdicts, loop-lag deltas; and the
hostile client's status-line parse."""

from __future__ import annotations

import pytest

from bench.lib.hostile import status_of
from bench.lib.hostile_eval import (
    RssSummary,
    by_phase,
    evaluate,
    loop_lag_over,
    phase_at,
    phase_plan,
    pooled,
    rss_summary,
)
from bench.lib.metrics import RequestTiming


def test_phase_plan_numbers_each_kind_back_to_back():
    phases = phase_plan(["warmup", "baseline", "hostile", "baseline", "hostile", "recovery"],
                        {"warmup": 5, "baseline": 10, "hostile": 10, "recovery": 20}, start_s=100.0)
    assert [p.name for p in phases] == ["warmup-1", "baseline-1", "hostile-1", "baseline-2", "hostile-2",
                                        "recovery-1"]
    assert [(p.start_s, p.end_s) for p in phases][:3] == [(100, 105), (105, 115), (115, 125)]
    assert phases[-1].end_s == 165


@pytest.mark.parametrize("t_s, name", [(99.9, None), (100.0, "warmup-1"), (104.99, "warmup-1"),
                                        (105.0, "baseline-1"), (125.0, None)])
def test_phase_at(t_s, name):
    phases = phase_plan(["warmup", "baseline", "hostile"], {"warmup": 5, "baseline": 10, "hostile": 10}, 100.0)
    found = phase_at(phases, t_s)
    assert (found.name if found else None) == name


def _req(ttft_s: float, gaps_s: list[float], ok: bool = True) -> RequestTiming:
    times = [ttft_s]
    for g in gaps_s:
        times.append(times[-1] + g)
    return RequestTiming(ok=ok, e2e_s=times[-1], chunk_times_s=times, chunk_tokens=[1] * len(times),
                         completion_tokens=len(times), error="" if ok else "HTTP 500")


def test_requests_belong_to_the_phase_they_were_sent_in_and_kinds_pool():
    phases = phase_plan(["baseline", "hostile", "baseline"], {"baseline": 10, "hostile": 10})
    sent = [(1.0, _req(0.1, [0.04])), (9.9, _req(0.1, [0.04])), (10.0, _req(0.2, [0.08])),
            (25.0, _req(0.1, [0.04])), (31.0, _req(9.0, [9.0]))]  # the last one after every phase: dropped
    grouped = by_phase(phases, sent)
    assert [len(grouped[p.name]) for p in phases] == [2, 1, 1]
    base, hostile = pooled(phases, grouped, "baseline"), pooled(phases, grouped, "hostile")
    assert base["num_ok"] == 3 and hostile["num_ok"] == 1
    assert base["ttft_ms"]["p99"] == pytest.approx(100.0)
    assert hostile["itl_ms"]["p99"] == pytest.approx(80.0)


def test_rss_before_is_the_end_of_the_first_baseline_and_after_the_last_sample():
    phases = phase_plan(["warmup", "baseline", "hostile", "recovery"],
                        {"warmup": 10, "baseline": 10, "hostile": 10, "recovery": 10})
    samples = [(5.0, 90.0), (12.0, 100.0), (19.0, 101.0), (25.0, 300.0), (35.0, 120.0), (40.0, 105.0)]
    rss = rss_summary(phases, samples)
    assert rss == RssSummary(before_mib=101.0, peak_mib=300.0, after_mib=105.0, growth=round(105 / 101 - 1, 4))
    assert rss_summary(phases, []) == RssSummary(None, None, None, None)


def _summary(ttft_p99: float | None, itl_p99: float | None, errors: int = 0) -> dict:
    return {"ttft_ms": {"p99": ttft_p99}, "itl_ms": {"p99": itl_p99}, "num_errors": errors}


@pytest.mark.parametrize("base, hostile, growth, latency_met, rss_met, ratios", [
    (_summary(100, 50), _summary(110, 55), 0.05, True, True, (1.1, 1.1)),
    (_summary(100, 50), _summary(120, 60), 0.10, True, True, (1.2, 1.2)),  # at the bound: met
    (_summary(100, 50), _summary(130, 50), 0.0, False, True, (1.3, 1.0)),  # TTFT alone misses
    (_summary(100, 50), _summary(100, 61), 0.0, False, True, (1.0, 1.22)),  # ITL alone misses
    (_summary(100, 50), _summary(100, 50, errors=1), 0.0, False, True, (1.0, 1.0)),  # an error fails it
    (_summary(100, 50), _summary(None, None), 0.0, False, True, (None, None)),  # nothing finished
    (_summary(100, 50), _summary(100, 50), 0.11, True, False, (1.0, 1.0)),  # RSS not given back
    (_summary(100, 50), _summary(100, 50), None, True, False, (1.0, 1.0)),  # no RSS samples
])
def test_goals(base, hostile, growth, latency_met, rss_met, ratios):
    goals = evaluate(base, hostile, RssSummary(100.0, 200.0, None, growth))
    assert (goals.ttft_p99_ratio, goals.itl_p99_ratio) == ratios
    assert (goals.latency_met, goals.rss_met, goals.met) == (latency_met, rss_met, latency_met and rss_met)


def test_loop_lag_probes_over_each_bound():
    lag = "splitserve_frontend_event_loop_lag_seconds"
    before = {f"{lag}_count": 10, f"{lag}_sum": 0.01, f'{lag}_bucket{{le="0.01"}}': 10,
              f'{lag}_bucket{{le="0.05"}}': 10, f'{lag}_bucket{{le="+Inf"}}': 10}
    after = {f"{lag}_count": 20, f"{lag}_sum": 0.21, f'{lag}_bucket{{le="0.01"}}': 17,
             f'{lag}_bucket{{le="0.05"}}': 19, f'{lag}_bucket{{le="+Inf"}}': 20}
    assert loop_lag_over(before, after) == {"num_probes": 10, "sum_s": 0.2,
                                            "probes_over_s": {"0.01": 3, "0.05": 1}}


@pytest.mark.parametrize("data, status", [(b"HTTP/1.1 431 Request Header Fields Too Large\r\n", 431),
                                          (b"HTTP/1.1 408 Request Timeout\r\n", 408), (b"", None),
                                          (b"garbage", None)])
def test_status_of(data, status):
    assert status_of(data) == status
