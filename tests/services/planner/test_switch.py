"""Switch first, scale second: pressure, the move (or why none), and what is left to scale (exact results)."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import pytest

from services.planner.policy import (
    ModelTarget,
    Observation,
    PlannerConfig,
    PlannerState,
    PoolDecision,
    ScaleDecision,
    decide,
)
from services.planner.switch import (
    Member,
    Move,
    NoMove,
    PoolPressure,
    Pressure,
    SwitchConfig,
    SwitchState,
    Tenure,
    choose_move,
    pool_pressure,
    switch_first,
    track_tenures,
)
from services.planner.workload import Slo

POLICY = PlannerConfig(slo=Slo(ttft_ms=1000, itl_ms=100), max_prefill=4, max_decode=4, max_workers=8)
CFG = SwitchConfig(min_dwell_s=30.0, short_intervals=2, spare_intervals=2)
BASE = Observation(duration_s=5, num_finished=50, arrival_rate_rps=10, isl_mean=512, osl_mean=64,
                   ttft_p90_ms=600, itl_p90_ms=60, num_prefill=2, num_decode=2)
# Two of each, all switchable, long settled (tenures from t=-100).
MEMBERS = (Member("p0", "prefill", True, 1), Member("p1", "prefill", True, 0),
           Member("d0", "decode", True, 3), Member("d1", "decode", True, 2))
SETTLED = SwitchState(tenures=tuple(Tenure(m.worker_id, m.role, -100.0) for m in MEMBERS))
SHORT_D = Pressure(prefill=PoolPressure(spare=True), decode=PoolPressure(short=("itl",)))
SHORT_P = Pressure(prefill=PoolPressure(short=("prefill_queue",)), decode=PoolPressure(spare=True))


def _pressure(obs: Observation, model: ModelTarget | None = None) -> Pressure:
    return pool_pressure(obs, decide(obs, PlannerState(), POLICY, model), POLICY, CFG, model)


@pytest.mark.parametrize("change, model, prefill, decode", [
    # Healthy everywhere, queues empty: each pool could give one away.
    ({}, None, PoolPressure(spare=True), PoolPressure(spare=True)),
    # ITL near its SLO: decode short; prefill (TTFT fine, no queue) spare.
    ({"itl_p90_ms": 95}, None, PoolPressure(spare=True), PoolPressure(short=("itl",))),
    # Prompts queue: prefill short; decode spare.
    ({"prefill_waiting": 3.0}, None, PoolPressure(short=("prefill_queue",)), PoolPressure(spare=True)),
    # TTFT near its SLO (not yet "short" for decide: the queues say decode's): no pool has a prefill worker
    # to spare, and decode is short.
    ({"ttft_p90_ms": 950, "decode_waiting": 1.0}, None, PoolPressure(), PoolPressure(short=("ttft",))),
    # A queue that one worker fewer would lengthen past spare_queue (0.3 * 2 / 1 = 0.6): not spare.
    ({"prefill_waiting": 0.3}, None, PoolPressure(), PoolPressure(spare=True)),
    # Decode KV would pass kv_high * low_water / high_water with one worker fewer (0.3 * 2 = 0.6 > 0.5).
    ({"decode_kv_usage": 0.3}, None, PoolPressure(spare=True), PoolPressure()),
    # The last worker of a pool is never spare.
    ({"num_prefill": 1}, None, PoolPressure(), PoolPressure(spare=True)),
    # A profile that wants more decode workers: decode short (decide's "model"); its target for the donor is not
    # read (it sizes the whole window, which lags a phase change).
    ({}, ModelTarget(2, 3), PoolPressure(spare=True), PoolPressure(short=("model",))),
    ({}, ModelTarget(3, 2), PoolPressure(short=("model",)), PoolPressure(spare=True)),
    # Too few finished requests: latencies are noise, queues still count.
    ({"num_finished": 2, "itl_p90_ms": 500}, None, PoolPressure(spare=True), PoolPressure(spare=True)),
])
def test_pool_pressure(change, model, prefill, decode) -> None:
    assert _pressure(replace(BASE, **change), model) == Pressure(prefill, decode)


def _twice(pressure: Pressure, members=MEMBERS, state=SETTLED, config=CFG, t0: float = 0.0, step_s: float = 5.0):
    first = choose_move(pressure, members, state, config, t0)
    return first, choose_move(pressure, members, first.state, config, t0 + step_s)


def test_moves_the_least_busy_worker_after_hysteresis() -> None:
    first, second = _twice(SHORT_D)
    assert first.choice == NoMove("hysteresis", "decode") and first.choice.wait
    assert second.choice == Move("p1", "prefill", "decode", ("itl",))  # p1 holds 0 requests, p0 holds 1
    assert second.state.last_move_to == "decode"
    assert Tenure("p1", "decode", 5.0) in second.state.tenures
    # The counts restart: the next decision qualifies afresh.
    assert (second.state.short_decode, second.state.spare_prefill) == (0, 0)
    _, second = _twice(SHORT_P)
    assert second.choice == Move("d1", "decode", "prefill", ("prefill_queue",))


@pytest.mark.parametrize("pressure, members, reason", [
    (Pressure(PoolPressure(), PoolPressure()), MEMBERS, "no_shortage"),
    (Pressure(PoolPressure(short=("ttft",)), PoolPressure(short=("itl",))), MEMBERS, "both_short"),
    (Pressure(PoolPressure(), PoolPressure(short=("itl",))), MEMBERS, "no_spare"),
    # Never the last worker of a pool (even one a stale pressure calls spare).
    (SHORT_D, MEMBERS[1:], "last_worker"),
    (SHORT_D, (replace(MEMBERS[0], draining=True),) + MEMBERS[1:], "last_worker"),
    (SHORT_D, tuple(replace(m, switchable=m.role == "decode") for m in MEMBERS), "not_switchable"),
])
def test_no_move(pressure, members, reason) -> None:
    _, second = _twice(pressure, members)
    assert isinstance(second.choice, NoMove) and second.choice.reason == reason
    assert not second.choice.wait


def test_no_move_into_a_full_pool() -> None:
    """The decode pool at its cap (2) takes no worker: the scale policy would drain one straight back."""
    _, second = _twice(SHORT_D, config=replace(CFG, max_decode=2))
    assert isinstance(second.choice, NoMove) and second.choice.reason == "full" and not second.choice.wait
    _, second = _twice(SHORT_D, config=replace(CFG, max_decode=3))
    assert isinstance(second.choice, Move)


@pytest.mark.parametrize("last_move_to, ago_s, projected, moves", [
    ("decode", 10.0, True, False),  # a second worker toward decode on the growth projection alone: no
    ("decode", 10.0, False, True),  # ... on today's load (or a window signal): yes
    ("decode", 40.0, True, True),  # the first move's dwell is over: the projection may move one again
    ("prefill", 40.0, True, True),  # the first toward decode in a while: the projection is the early warning
    (None, 0.0, True, True),
])
def test_a_projected_shortage_moves_one_worker(last_move_to, ago_s, projected, moves) -> None:
    """A pool short only by the growth projection (which assumes no sequence finishes within its horizon, so it
    overshoots a ramp's steady state) takes one worker on it, not a second within the dwell."""
    pressure = replace(SHORT_D, decode=PoolPressure(short=("itl_pred",), projected=projected))
    state = replace(SETTLED, last_move_s=-ago_s, last_move_to=last_move_to)
    _, second = _twice(pressure, state=state)
    if moves:
        assert isinstance(second.choice, Move)
    else:
        assert second.choice == NoMove("projected", "decode") and not second.choice.wait


def test_dwell_gap_and_reversal() -> None:
    # Workers that joined their pool 10 s ago (just started, or just moved) stay for min_dwell_s.
    fresh = SwitchState(tenures=tuple(Tenure(m.worker_id, m.role, -10.0) for m in MEMBERS))
    _, second = _twice(SHORT_D, state=fresh)
    assert second.choice == NoMove("dwell", "decode") and second.choice.wait
    _, later = _twice(SHORT_D, state=fresh, t0=20.0)
    assert isinstance(later.choice, Move)
    # A move toward prefill 10 s ago: moving another worker back toward decode would undo it.
    recent = replace(SETTLED, last_move_s=-5.0, last_move_to="prefill")
    _, second = _twice(SHORT_D, state=recent)
    assert second.choice == NoMove("reversal", "decode")
    # The same direction again is allowed (the pool is still short), but not within min_gap_s.
    _, second = _twice(SHORT_P, state=recent, config=replace(CFG, min_gap_s=15.0))
    assert second.choice == NoMove("gap", "prefill")
    _, second = _twice(SHORT_P, state=recent)
    assert isinstance(second.choice, Move)


def test_tenures_follow_roles() -> None:
    old = (Tenure("a", "prefill", 1.0), Tenure("gone", "decode", 1.0), Tenure("b", "decode", 1.0))
    members = [Member("a", "prefill", True), Member("b", "prefill", True), Member("new", "decode", True)]
    # a kept; b moved (by an operator): restarted; new: now; gone: forgotten.
    assert track_tenures(members, old, 9.0) == (Tenure("a", "prefill", 1.0), Tenure("b", "prefill", 9.0),
                                                Tenure("new", "decode", 9.0))


DECISION = ScaleDecision(prefill=PoolDecision("prefill", 2, 2), decode=PoolDecision("decode", 2, 3, ("itl",)))


@pytest.mark.parametrize("decision, choice, prefill, decode", [
    # A move: the pools' new sizes, nothing started.
    (DECISION, Move("p1", "prefill", "decode", ("itl",)), (2, 1, ("switch:p1",)), (2, 3, ("switch:p1",))),
    (DECISION, Move("d1", "decode", "prefill", ("ttft",)), (2, 3, ("switch:d1",)), (2, 1, ("switch:d1",))),
    # A move on its way (dwell, hysteresis): the short pool does not grow; the donor does not shrink.
    (replace(DECISION, prefill=PoolDecision("prefill", 2, 1, ("quiet",))), NoMove("dwell", "decode"),
     (2, 2, ()), (2, 2, ())),
    # No move possible: decide's targets (start a decode worker; stop a quiet one).
    (DECISION, NoMove("no_spare", "decode"), (2, 2, ()), (2, 3, ("itl",))),
    (DECISION, NoMove("not_switchable", "decode"), (2, 2, ()), (2, 3, ("itl",))),
    (replace(DECISION, decode=PoolDecision("decode", 2, 1, ("quiet",))), NoMove("no_shortage"),
     (2, 2, ()), (2, 1, ("quiet",))),
])
def test_switch_first(decision, choice, prefill, decode) -> None:
    out = switch_first(decision, choice)
    assert (out.prefill.current, out.prefill.target, out.prefill.reasons) == prefill
    assert (out.decode.current, out.decode.target, out.decode.reasons) == decode


def _simulate(flip_s: float, duration_s: float, interval_s: float = 5.0, config: SwitchConfig = CFG,
              lag_intervals: int = 1) -> tuple[list[tuple[float, Move]], list[tuple[int, int]]]:
    """Four switchable workers (2P + 2D) under a workload that needs 3P + 1D, then 1P + 3D, flipping every
    ``flip_s``. The planner sees each pool's need ``lag_intervals`` decisions late (its metrics are windows)."""
    roles = {"w0": "prefill", "w1": "prefill", "w2": "decode", "w3": "decode"}
    state, moves, sizes = SwitchState(), [], []
    for k in range(int(duration_s / interval_s)):
        now_s = k * interval_s
        seen_s = max(0.0, now_s - lag_intervals * interval_s)
        need_p, need_d = (3, 1) if int(seen_s // flip_s) % 2 == 0 else (1, 3)
        n_p = sum(r == "prefill" for r in roles.values())
        n_d = len(roles) - n_p
        pressure = Pressure(PoolPressure(("ttft",) if n_p < need_p else (), n_p > need_p),
                            PoolPressure(("itl",) if n_d < need_d else (), n_d > need_d))
        members = [Member(w, r, True) for w, r in sorted(roles.items())]
        out = choose_move(pressure, members, state, config, now_s)
        state = out.state
        if isinstance(out.choice, Move):
            assert roles[out.choice.worker_id] == out.choice.from_role
            roles[out.choice.worker_id] = out.choice.to_role
            moves.append((now_s, out.choice))
        sizes.append((sum(r == "prefill" for r in roles.values()), sum(r == "decode" for r in roles.values())))
    return moves, sizes


def _check_guards(moves: list[tuple[float, Move]], sizes: list[tuple[int, int]], config: SwitchConfig) -> None:
    assert all(p >= 1 and d >= 1 for p, d in sizes)  # never the last worker of a pool
    times = [t for t, _ in moves]
    assert len(times) == len(set(times))  # at most one move per decision
    for (t0, a), (t1, b) in pairwise(moves):
        if a.to_role != b.to_role:
            assert t1 - t0 >= config.min_dwell_s  # no reversal within the dwell
    last: dict[str, float] = {}
    for t, m in moves:
        assert t - last.get(m.worker_id, float("-inf")) >= config.min_dwell_s  # per-worker dwell
        last[m.worker_id] = t


def test_workload_flipping_every_30s() -> None:
    """Flips every 30 s (decisions every 5 s, seen one decision late, dwell 30 s): one move per 30 s, each
    toward the pool the current phase starves, alternating; never thrashing, never the last worker."""
    moves, sizes = _simulate(flip_s=30.0, duration_s=300.0)
    _check_guards(moves, sizes, CFG)
    # The first waits out the workers' dwell from their first sighting (t=0); then every 30 s, alternating.
    assert [t for t, _ in moves] == [30.0 * k for k in range(1, 10)]
    assert [m.to_role for _, m in moves] == ["prefill", "decode"] * 4 + ["prefill"]
    assert set(sizes) == {(2, 2), (3, 1)}  # half a swing each way: the dwell caps the amplitude
    # Without the guards the same workload (seen two decisions late) moves a worker at every decision it can.
    bare = SwitchConfig(min_dwell_s=0.0, short_intervals=1, spare_intervals=1)
    bare_moves, _ = _simulate(flip_s=30.0, duration_s=300.0, config=bare, lag_intervals=2)
    guarded_moves, _ = _simulate(flip_s=30.0, duration_s=300.0, lag_intervals=2)
    assert len(guarded_moves) <= 10 < len(bare_moves)


def test_workload_changing_slowly_is_followed_fully() -> None:
    """Phases of 120 s: the pools reach each phase's need (3P + 1D, then 1P + 3D) one move per decision
    once the dwell allows, and then stay put."""
    moves, sizes = _simulate(flip_s=120.0, duration_s=480.0)
    _check_guards(moves, sizes, CFG)
    assert (sizes[20], sizes[44], sizes[68], sizes[92]) == ((3, 1), (1, 3), (3, 1), (1, 3))  # t = 100, 220, 340, 460 s
    # Each flip is seen one decision late (125 s); two decisions short, then one move per decision.
    assert [t for t, _ in moves][1:3] == [130.0, 140.0]
    assert len(moves) == 1 + 2 * 3  # 2P+2D -> 3P+1D, then two workers each flip


def test_workload_flipping_faster_than_the_dwell() -> None:
    """Flips every 10 s: moves come no faster than the dwell allows (at most one per 30 s after the first)."""
    moves, sizes = _simulate(flip_s=10.0, duration_s=300.0)
    _check_guards(moves, sizes, CFG)
    assert len(moves) <= 300 / 30 + 1


def test_flicker_shorter_than_hysteresis_moves_nothing() -> None:
    """A pool short for one decision at a time (noise) never qualifies: short_intervals=2."""
    state = SETTLED
    for k in range(20):
        pressure = SHORT_D if k % 2 == 0 else Pressure(PoolPressure(spare=True), PoolPressure())
        state = choose_move(pressure, MEMBERS, state, CFG, k * 5.0).state
        assert state.last_move_to is None
