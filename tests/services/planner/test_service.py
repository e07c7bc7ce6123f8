"""The planner's loop body: pending targets held while workers start or drain; model targets from a profile."""

from __future__ import annotations

from dataclasses import replace

import pytest

from common.timing import TimingModel
from services.planner.observe import FrontendSnapshot
from services.planner.policy import Observation, PlannerConfig, PoolDecision
from services.planner.service import (
    Pending,
    PlannerService,
    PlannerServiceConfig,
    hold_pending,
    model_target,
    next_wait_s,
)
from services.planner.workload import Slo

SLO = Slo(ttft_ms=1000, itl_ms=100)
OBS = Observation(duration_s=5, num_finished=50, arrival_rate_rps=10, isl_mean=512, osl_mean=64, ttft_p90_ms=600,
                  itl_p90_ms=60, num_prefill=1, num_decode=1)


def test_hold_pending() -> None:
    up = PoolDecision("prefill", current=1, target=2, reasons=("ttft",))
    same = PoolDecision("prefill", current=1, target=1)
    assert hold_pending(same, None, 10.0, 60.0) == same
    # A worker is starting (target 2, still 1 serving): hold 2, do not add a third for the same shortage.
    assert hold_pending(same, Pending(2, 0.0), 10.0, 60.0) == PoolDecision("prefill", 1, 2, ("pending",))
    assert hold_pending(up, Pending(2, 0.0), 10.0, 60.0) == PoolDecision("prefill", 1, 2, ("pending",))
    # Growth beyond the pending target (the model wants 4) goes through.
    assert hold_pending(replace(up, target=4), Pending(2, 0.0), 10.0, 60.0).target == 4
    # Reached, or timed out: the fresh decision.
    assert hold_pending(same, Pending(1, 0.0), 10.0, 60.0) == same
    assert hold_pending(same, Pending(2, 0.0), 61.0, 60.0) == same
    # A drain in progress (target 1, 2 serving) is not undone by "no change".
    assert hold_pending(PoolDecision("decode", 2, 2), Pending(1, 0.0, grow=False), 10.0, 60.0).target == 1
    # Growth to 1 asked while no worker had registered yet (engines starting); then 2 register: reached, and the
    # fresh decision stands (nobody is drained for the stale target).
    assert hold_pending(PoolDecision("prefill", 2, 2), Pending(1, 0.0, grow=True), 10.0, 60.0).target == 2


def _service(**kw) -> PlannerService:
    return PlannerService(PlannerServiceConfig(router_endpoint="tcp://127.0.0.1:1", metrics_urls=(),
                                               policy=PlannerConfig(slo=SLO), **kw))


def test_step_publishes_both_pools_every_interval_and_holds_pending() -> None:
    svc = _service()
    r1 = svc.step(replace(OBS, prefill_waiting=3.0), now_s=0.0)
    assert [(m.pool, m.current, m.target) for m in r1["requests"]] == [("prefill", 1, 2), ("decode", 1, 1)]
    # Next interval: the new worker is not up yet and the queue is still there: still 2, not 3.
    r2 = svc.step(replace(OBS, prefill_waiting=3.0), now_s=5.0)
    assert [(m.pool, m.target, m.reason) for m in r2["requests"]] == [("prefill", 2, "pending"), ("decode", 1, "")]
    # It registered and is busy: now a third is allowed.
    r3 = svc.step(replace(OBS, num_prefill=2, prefill_waiting=3.0), now_s=10.0)
    assert r3["requests"][0].target == 3
    assert [m.seq for m in r1["requests"] + r2["requests"] + r3["requests"]] == [1, 2, 3, 4, 5, 6]


def test_model_target_from_timing() -> None:
    timing = TimingModel(prefill_coeffs_s=(0.0, 0.001))  # 2048 tokens: ~2 s of prefill
    cfg = PlannerConfig(slo=Slo(ttft_ms=3000, itl_ms=100))
    small = model_target(timing, replace(OBS, isl_mean=512, arrival_rate_rps=0.5), cfg, _service().config.plan_options)
    large = model_target(timing, replace(OBS, isl_mean=2048, arrival_rate_rps=1.5), cfg, _service().config.plan_options)
    assert small is not None and large is not None
    assert large.num_prefill > small.num_prefill
    assert model_target(timing, replace(OBS, isl_mean=None), cfg, _service().config.plan_options) is None
    # A third of the arrivals are long: sized for that mix, more than for its mean ISL alone.
    mix = replace(OBS, isl_mean=1024, arrival_rate_rps=1.2, isl_samples=(512, 512, 2048) * 10)
    flat = replace(mix, isl_samples=())
    opts = _service().config.plan_options
    assert model_target(timing, mix, cfg, opts).num_prefill > model_target(timing, flat, cfg, opts).num_prefill


def test_role_switch_step_moves_instead_of_starting() -> None:
    """Decode short, prefill spare: after the hysteresis, a move (pool sizes after it), not a new worker;
    refused by the router: this interval scales as if no move were possible."""
    from common.protocol import RoleSet
    from services.planner.switch import Member, Move, SwitchConfig

    svc = _service(role_switch=True, switch=SwitchConfig(min_dwell_s=0.0, short_intervals=2, spare_intervals=1))
    members = (Member("p0", "prefill", True), Member("p1", "prefill", True, num_busy=2), Member("d0", "decode", True))
    obs = replace(OBS, num_prefill=2, itl_p90_ms=95)  # ITL near its SLO; TTFT fine, queues empty
    r1 = svc.step(obs, now_s=0.0, members=members)
    assert r1["move"] is None and r1["no_move"] == "hysteresis"
    assert [(m.pool, m.target) for m in r1["requests"]] == [("prefill", 2), ("decode", 1)]  # waits for the move
    r2 = svc.step(replace(obs, end_s=5.0), now_s=5.0, members=members)
    assert r2["move"] == Move("p0", "prefill", "decode", ("itl",))
    assert [(m.pool, m.current, m.target) for m in r2["requests"]] == [("prefill", 2, 1), ("decode", 1, 2)]
    svc.moved(r2, RoleSet(request_id="x", worker_id="p0", role="decode", ok=True, seconds=0.3), now_s=5.0)
    assert r2["role_set"]["seconds"] == 0.3
    # Windows that began before the move no longer count for latency (only live queues and KV do).
    r3 = svc.step(replace(obs, num_prefill=1, num_decode=2, end_s=8.0), now_s=8.0, members=members)
    assert r3["move"] is None and r3["requests"][1].target == 2

    svc = _service(role_switch=True, switch=SwitchConfig(min_dwell_s=0.0, short_intervals=1, spare_intervals=1))
    r = svc.step(obs, now_s=0.0, members=members)
    assert isinstance(r["move"], Move)
    svc.move_refused(r, obs, 0.0, "not switchable")
    assert r["move_refused"] == "not switchable"
    assert [(m.pool, m.target, m.reason) for m in r["requests"]] == [("prefill", 2, ""), ("decode", 2, "itl")]


@pytest.mark.parametrize(("no_move", "confirm_s", "expected"), [
    (None, None, 2.0),  # a move, or the loop's first observations
    ("no_spare", None, 2.0),
    ("dwell", 0.5, 2.0),  # waits on time, not on evidence: re-reading sooner says nothing new
    ("hysteresis", None, 0.5),  # a quarter interval
    ("hysteresis", 0.25, 0.25),
    ("hysteresis", 5.0, 2.0),  # never longer than the interval
])
def test_next_wait_s(no_move: str | None, confirm_s: float | None, expected: float) -> None:
    assert next_wait_s(no_move, 2.0, confirm_s) == expected


def test_a_move_waiting_on_hysteresis_is_confirmed_between_intervals() -> None:
    """The donor must read spare twice: the confirming observation moves the worker, reusing the interval's
    window verdict (its quiet counts are not advanced) and measuring growth from the interval's observation;
    moves stay one per interval."""
    from services.planner.switch import Member, Move, SwitchConfig

    svc = _service(role_switch=True, interval_s=2.0,
                   switch=SwitchConfig(min_dwell_s=0.0, short_intervals=1, spare_intervals=2))
    members = (Member("p0", "prefill", True), Member("p1", "prefill", True, num_busy=2), Member("p2", "prefill", True),
               Member("d0", "decode", True))
    obs = replace(OBS, num_prefill=3, itl_p90_ms=95, end_s=0.0)  # ITL near its SLO; TTFT fine, queues empty
    r1 = svc.step(obs, now_s=0.0, members=members)
    assert (r1["move"], r1["no_move"], r1["confirm"]) == (None, "hysteresis", False)
    state = svc._state
    r2 = svc.step(replace(obs, end_s=0.5), now_s=0.5, members=members, confirm=True)
    assert r2["confirm"] is True and r2["move"] == Move("p0", "prefill", "decode", ("itl",))
    assert (svc._state.quiet_prefill, svc._state.quiet_decode) == (state.quiet_prefill, state.quiet_decode)
    assert svc._last_obs.end_s == 0.0
    # Still short and spare one interval later: the next move waits out the interval since the last.
    members = (Member("p1", "prefill", True, num_busy=2), Member("p2", "prefill", True), Member("p0", "decode", True),
               Member("d0", "decode", True))
    # Decode still short by its queue (the ITL window, measured on one decode worker, no longer counts once the
    # pool's observed size changed).
    later = replace(obs, num_prefill=2, num_decode=2, decode_waiting=svc.config.policy.queue_high + 1)
    r3 = svc.step(replace(later, end_s=2.0), now_s=2.0, members=members)
    assert r3["no_move"] == "hysteresis"  # the move reset both pools' streaks
    r4 = svc.step(replace(later, end_s=2.4), now_s=2.4, members=members, confirm=True)
    assert r4["no_move"] == "gap"  # 2.4 s after the last move < min_gap_s = the interval
    r5 = svc.step(replace(later, end_s=4.5), now_s=4.5, members=members)
    assert isinstance(r5["move"], Move)


def test_members_of_worker_list() -> None:
    from common.protocol import WorkerInfo, WorkerList, WorkerLoad
    from services.planner.service import members_of
    from services.planner.switch import Member

    def info(wid: str, role: str, switchable: bool) -> WorkerInfo:
        return WorkerInfo(worker_id=wid, role=role, model="m", block_size=32, num_blocks=10, endpoint="tcp://x",
                          switchable=switchable)

    listed = WorkerList(request_id="r", workers=(info("p", "prefill", True), info("d", "decode", False),
                                                 info("a", "both", True)),
                        loads=(WorkerLoad(num_running=2, num_waiting=1), WorkerLoad(), WorkerLoad()), draining=("d",))
    assert members_of(listed) == (Member("p", "prefill", True, 3), Member("d", "decode", False, 0, draining=True))


def test_a_confirmation_measures_decode_growth_over_the_interval() -> None:
    """A confirmation half a second after a decision projects the decode pool's growth from the observation
    that decision measured it from: 4 sequences in 2.5 s, not 0 (or 1 arrival) in 0.5 s."""
    from services.planner.switch import Member, SwitchConfig

    svc = _service(role_switch=True, interval_s=2.0, timing=TimingModel(),
                   switch=SwitchConfig(min_dwell_s=0.0, short_intervals=1, spare_intervals=2))
    members = (Member("p0", "prefill", True), Member("p1", "prefill", True), Member("d0", "decode", True))
    obs = replace(OBS, num_prefill=2, decode_seqs=0, end_s=0.0)
    svc.step(obs, now_s=0.0, members=members)
    svc.step(replace(obs, decode_seqs=4, end_s=2.0), now_s=2.0, members=members)
    r = svc.step(replace(obs, decode_seqs=4, end_s=2.5), now_s=2.5, members=members, confirm=True)
    assert r["confirm"] is True
    assert r["live"]["projected_seqs"] == 4 + 4 / 2.5 * 20.0  # LiveConfig().horizon_s


def test_role_switch_step_keeps_a_worker_that_just_registered() -> None:
    """Engines register one by one: quiet intervals counted at 1P + 1D do not drain the second prefill worker as it
    registers (the role-switch path keeps the pool's observed change; measured with real vLLM engines)."""
    svc = _service(role_switch=True)
    idle = replace(OBS, duration_s=10, num_finished=0, arrival_rate_rps=0.0, isl_mean=None, osl_mean=None,
                   ttft_p90_ms=None, itl_p90_ms=None)
    for t in (2.0, 4.0):
        svc.step(replace(idle, end_s=t), now_s=t)
    targets = [svc.step(replace(idle, num_prefill=2, end_s=t), now_s=t)["requests"][0].target
               for t in (6.0, 8.0, 10.0, 12.0, 14.0)]
    assert targets == [2, 2, 2, 2, 2]  # windows of 10 s: none is quiet before one began after t=6


def test_recent_scrape_is_about_an_interval_old() -> None:
    """Arrivals are counted since the newest scrape at least 3/4 interval old: a decision 2 s after the last
    reads those 2 s; a confirmation 0.5 s after a decision reads from the scrape before it."""
    from collections import deque

    from services.planner.service import recent_scrape

    snaps = [FrontendSnapshot((), (), float(i), 0, 0, 0) for i in range(4)]
    history = deque([(0.0, snaps[0]), (2.0, snaps[1]), (4.0, snaps[2])])
    assert recent_scrape(history, 4.0, 2.0) == (2.0, snaps[1])
    history.append((4.5, snaps[3]))
    assert recent_scrape(history, 4.5, 2.0) == (2.0, snaps[1])
    assert recent_scrape(deque([(0.0, snaps[0]), (0.5, snaps[1])]), 0.5, 2.0) == (0.0, snaps[0])
