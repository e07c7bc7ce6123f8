"""The planner's loop body: pending targets held while workers start or drain; model targets from a profile."""

from __future__ import annotations

from dataclasses import replace

from common.timing import TimingModel
from services.planner.policy import Observation, PlannerConfig, PoolDecision
from services.planner.service import (
    Pending,
    PlannerService,
    PlannerServiceConfig,
    hold_pending,
    model_target,
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
    assert hold_pending(PoolDecision("decode", 2, 2), Pending(1, 0.0), 10.0, 60.0).target == 1


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
