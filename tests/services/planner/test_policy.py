"""The live planner's decisions on synthetic metric series (exact targets)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from services.planner.policy import (
    ModelTarget,
    Observation,
    PlannerConfig,
    PlannerState,
    decide,
)
from services.planner.workload import Slo

CONFIG = PlannerConfig(slo=Slo(ttft_ms=1000, itl_ms=100), max_prefill=4, max_decode=4, max_workers=6,
                       down_after_intervals=3)
# A healthy interval: p90s well inside the SLOs but not "quiet" (TTFT above half its SLO).
BASE = Observation(duration_s=5, num_finished=50, arrival_rate_rps=10, isl_mean=512, osl_mean=64,
                   ttft_p90_ms=600, itl_p90_ms=60, num_prefill=2, num_decode=2)


@pytest.mark.parametrize("change, prefill, decode, p_reasons, d_reasons", [
    ({}, 2, 2, (), ()),
    # Prompts queue on the prefill workers: prefill grows, decode does not.
    ({"prefill_waiting": 3.0}, 3, 2, ("prefill_queue",), ()),
    # TTFT near its SLO and the prefill queue is the longer one: prefill.
    ({"ttft_p90_ms": 950, "prefill_waiting": 1.0, "decode_waiting": 0.0}, 3, 2, ("ttft",), ()),
    # TTFT near its SLO but requests wait on the decode workers (local prefill, admission): decode.
    ({"ttft_p90_ms": 950, "prefill_waiting": 0.0, "decode_waiting": 1.0}, 2, 3, (), ("ttft",)),
    # ITL near its SLO: decode only.
    ({"itl_p90_ms": 95}, 2, 3, (), ("itl",)),
    ({"decode_kv_usage": 0.95}, 2, 3, (), ("decode_kv",)),
    ({"decode_waiting": 2.5}, 2, 3, (), ("decode_queue",)),
    # Both short: both grow (within max_workers 6).
    ({"prefill_waiting": 3.0, "itl_p90_ms": 120}, 3, 3, ("prefill_queue",), ("itl",)),
    # Too few finished requests: percentiles ignored, queues still count.
    ({"num_finished": 2, "ttft_p90_ms": 5000, "itl_p90_ms": 500}, 2, 2, (), ()),
    ({"num_finished": 2, "prefill_waiting": 3.0}, 3, 2, ("prefill_queue",), ()),
    # At the pool's maximum nothing grows.
    ({"num_prefill": 4, "prefill_waiting": 3.0}, 4, 2, (), ()),
])
def test_scale_up_reads_which_pool_is_short(change, prefill, decode, p_reasons, d_reasons) -> None:
    d = decide(replace(BASE, **change), PlannerState(), CONFIG)
    assert (d.prefill.target, d.decode.target) == (prefill, decode)
    assert (d.prefill.reasons, d.decode.reasons) == (p_reasons, d_reasons)


def test_more_requests_alone_scales_nothing() -> None:
    """Twice the rate with the same latencies and queues: the signals, not the rate, decide."""
    d = decide(replace(BASE, arrival_rate_rps=20, num_finished=100), PlannerState(), CONFIG)
    assert not d.prefill.changed and not d.decode.changed


def test_model_target_scales_ahead_of_the_slo() -> None:
    d = decide(BASE, PlannerState(), CONFIG, ModelTarget(num_prefill=4, num_decode=2))
    assert (d.prefill.target, d.prefill.reasons) == (4, ("model",))
    assert not d.decode.changed
    # Reactive +1 and a larger model target: the larger wins, both reasons kept.
    d = decide(replace(BASE, prefill_waiting=3), PlannerState(), CONFIG, ModelTarget(num_prefill=4, num_decode=1))
    assert (d.prefill.target, d.prefill.reasons) == (4, ("prefill_queue", "model"))
    assert not d.decode.changed  # a model asking for fewer does not shrink at once


def test_budget_trims_the_pool_with_the_shorter_queue() -> None:
    cfg = replace(CONFIG, max_workers=5)
    obs = replace(BASE, prefill_waiting=3.0, decode_waiting=2.5, itl_p90_ms=120)
    d = decide(obs, PlannerState(), cfg)
    assert (d.prefill.target, d.decode.target) == (3, 2)
    d = decide(replace(obs, prefill_waiting=2.1, decode_waiting=4.0), PlannerState(), cfg)
    assert (d.prefill.target, d.decode.target) == (2, 3)


QUIET = replace(BASE, ttft_p90_ms=200, itl_p90_ms=20, prefill_waiting=0.0, decode_waiting=0.0, decode_kv_usage=0.1)


def test_scale_down_needs_quiet_intervals_in_a_row() -> None:
    state = PlannerState()
    targets = []
    series = [QUIET, QUIET, QUIET, QUIET, replace(QUIET, ttft_p90_ms=700), QUIET, QUIET, QUIET]
    for i, obs in enumerate(series, start=1):  # back-to-back 5 s windows
        d = decide(replace(obs, end_s=5.0 * i), state, CONFIG)
        state = d.state
        targets.append((d.prefill.target, d.decode.target))
    # Third quiet interval: one fewer of each; the count restarts; a busy interval (TTFT 700 ms) resets it.
    assert targets == [(2, 2), (2, 2), (1, 1), (2, 2), (2, 2), (2, 2), (2, 2), (1, 1)]


def test_scale_down_respects_the_model_and_the_minimum() -> None:
    state = PlannerState(quiet_prefill=5, quiet_decode=5)
    d = decide(QUIET, state, CONFIG, ModelTarget(num_prefill=2, num_decode=1))
    assert (d.prefill.target, d.decode.target) == (2, 1)  # the model needs both prefill workers
    d = decide(replace(QUIET, num_prefill=1, num_decode=1), state, CONFIG)
    assert (d.prefill.target, d.decode.target) == (1, 1)


def test_isl_then_osl_growth_series() -> None:
    """ISL grows: prefill queues, prefill scales; then OSL grows: ITL and KV climb, decode scales."""
    series = [
        (replace(BASE, num_prefill=1, num_decode=1, isl_mean=2048, prefill_waiting=4.0, ttft_p90_ms=1800), (2, 1)),
        (replace(BASE, num_prefill=2, num_decode=1, isl_mean=2048, prefill_waiting=0.5), (2, 1)),
        (replace(BASE, num_prefill=2, num_decode=1, isl_mean=2048, osl_mean=512, itl_p90_ms=140,
                 decode_kv_usage=0.93), (2, 2)),
        (replace(BASE, num_prefill=2, num_decode=2, isl_mean=2048, osl_mean=512, itl_p90_ms=70), (2, 2)),
    ]
    state = PlannerState()
    for obs, expected in series:
        d = decide(obs, state, CONFIG)
        state = d.state
        assert (d.prefill.target, d.decode.target) == expected


def test_an_idle_graph_scales_down() -> None:
    idle = replace(QUIET, num_finished=0, arrival_rate_rps=0.0, ttft_p90_ms=None, itl_p90_ms=None, isl_mean=None,
                   osl_mean=None)
    state = PlannerState()
    for _ in range(3):
        d = decide(idle, state, CONFIG)
        state = d.state
    assert (d.prefill.target, d.decode.target) == (1, 1)
    # A few slow requests (untrusted p90) but empty queues: still quiet; a queue is not.
    assert decide(replace(idle, num_finished=2, ttft_p90_ms=5000), PlannerState(2, 2), CONFIG).prefill.target == 1
    assert decide(replace(idle, prefill_waiting=1.0), PlannerState(2, 2), CONFIG).prefill.target == 2


def test_a_window_older_than_the_last_change_holds_no_latency_signal() -> None:
    """After prefill grew at t=100, a 30 s window still showing the old TTFT neither grows it again nor
    counts as quiet; a live queue still grows it. Decode, unchanged, reads its latencies as usual."""
    state = PlannerState(changed_prefill_s=100.0)
    stale = replace(BASE, end_s=120.0, duration_s=30.0, ttft_p90_ms=950, prefill_waiting=1.0, itl_p90_ms=95)
    d = decide(stale, state, CONFIG)
    assert (d.prefill.target, d.decode.target) == (2, 3)
    assert decide(replace(stale, prefill_waiting=3.0), state, CONFIG).prefill.reasons == ("prefill_queue",)
    quiet_but_stale = replace(QUIET, end_s=120.0, duration_s=30.0)
    assert decide(quiet_but_stale, replace(state, quiet_prefill=5), CONFIG).state.quiet_prefill == 0
    fresh = replace(stale, end_s=131.0)
    d = decide(fresh, state, CONFIG)
    assert (d.prefill.target, d.prefill.reasons) == (3, ("ttft",))
    assert d.state.changed_prefill_s == 131.0 and d.state.changed_decode_s == 131.0


def test_a_pool_that_grew_by_registration_starts_its_quiet_count_over() -> None:
    """Engines registering one by one: quiet intervals counted with one prefill worker do not drain the second
    the moment it registers; the pool is quiet again only once a whole window has seen its new size."""
    idle = replace(QUIET, num_finished=0, arrival_rate_rps=0.0, ttft_p90_ms=None, itl_p90_ms=None, isl_mean=None,
                   osl_mean=None, num_prefill=1, num_decode=1, duration_s=10.0)
    state = PlannerState()
    for i in range(1, 3):  # 2 quiet intervals at 1P + 1D: one more would have made 3 in a row
        state = decide(replace(idle, end_s=2.0 * i), state, CONFIG).state
    assert state.quiet_prefill == CONFIG.down_after_intervals - 1
    grown = replace(idle, num_prefill=2)
    d = decide(replace(grown, end_s=6.0), state, CONFIG)
    assert d.prefill.target == 2 and d.state.quiet_prefill == 0 and d.state.changed_prefill_s == 6.0
    targets = []
    for end_s in (8.0, 10.0, 12.0, 14.0, 16.0, 18.0, 20.0, 22.0):
        d = decide(replace(grown, end_s=end_s), d.state, CONFIG)
        targets.append(d.prefill.target)
    # Windows of 10 s: fresh from t=16 on; quiet 3 intervals in a row there (16, 18, 20): one fewer at 20.
    assert targets == [2, 2, 2, 2, 2, 2, 1, 2]
