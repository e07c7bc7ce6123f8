"""The live planner's decision: from one interval's observation, how many prefill and decode workers.

Pure: ``decide(obs, state, config, model)`` returns the targets, the reasons as data, and the next state
(consecutive quiet intervals per pool), so every rule is table-tested on synthetic metric series.

Which pool is short is read from where the time goes, not from "more requests":
  * prefill is short when prompts queue on the prefill workers (``prefill_waiting`` per worker over
    ``queue_high``), or TTFT's p90 nears its SLO while the prefill queue is the longer one;
  * decode is short when ITL's p90 nears its SLO, decode KV usage passes ``kv_high`` (new sequences would
    wait or preempt), decode workers queue, or TTFT nears its SLO while the decode queue is the longer one
    (local prefills and admission wait there).
With a profile, the model-based target (``services.planner.plan`` on the observed rate, ISL and OSL) scales
ahead of the SLO breaking: a pool grows to the larger of the model's target and the reactive one.
Scaling up is at once (to the model's target, or one more worker); scaling down is one worker at a time,
after ``down_after_intervals`` quiet intervals in a row, and only to what the model (if any) says suffices:
capacity removed too early costs SLO, capacity kept too long costs only money.

Observations are sliding windows (the service decides every few seconds over the last ~30 s). A window that
began before a pool's last change (its target, or its size as observed: a worker registered, drained or moved)
still holds latencies of the old size: for that pool, latency signals neither grow it again nor count as quiet
(queues and KV usage, read live, still do).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from common.protocol import Role
from services.planner.defaults import MAX_DECODE, MAX_PREFILL, MAX_WORKERS
from services.planner.workload import Slo


@dataclass(frozen=True, slots=True)
class Observation:
    """One interval of a running graph: frontend /metrics deltas and the router's worker list."""

    duration_s: float  # the window's length
    num_finished: int  # requests finished in the window (the latency percentiles' sample)
    arrival_rate_rps: float
    isl_mean: float | None
    osl_mean: float | None
    ttft_p90_ms: float | None
    itl_p90_ms: float | None
    num_prefill: int  # serving workers (draining ones excluded)
    num_decode: int
    prefill_waiting: float = 0.0  # mean requests waiting per prefill worker
    decode_waiting: float = 0.0
    decode_kv_usage: float = 0.0  # mean used share of decode workers' KV blocks, 0..1
    end_s: float = 0.0  # monotonic time the window ends
    # Prompt lengths of the window's arrivals (equally weighted, at histogram bucket bounds): the model plans
    # for the distribution, since a few long prompts among short ones set the prefill pool's p90.
    isl_samples: tuple[int, ...] = ()
    # Live state of the pools (the router's worker list, read at ``end_s``): what ``services.planner.predict``
    # turns into predicted latencies.
    decode_seqs: int = 0  # sequences on decode workers, running or waiting
    decode_running: int = 0
    decode_kv_tokens: int = 0  # KV tokens the running ones attend (active blocks x block size)
    prefill_backlog_tokens: float = 0.0  # prompt tokens queued on prefill workers, the rest of running ones too
    prefill_tokens_per_s: float = 0.0  # mean prefill rate the workers measured (0: none did)
    # Arrivals over about the last interval (not the window): the decode load coming, before it reaches a worker.
    recent_arrival_rps: float = 0.0
    recent_max_tokens: float | None = None  # their mean max_tokens (None: none set one)


@dataclass(frozen=True, slots=True)
class ModelTarget:
    """Workers the profile-based plan needs for the observed workload (None: the model has no answer)."""

    num_prefill: int | None
    num_decode: int | None


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    slo: Slo
    min_prefill: int = 1
    max_prefill: int = MAX_PREFILL
    min_decode: int = 1
    max_decode: int = MAX_DECODE
    max_workers: int = MAX_WORKERS  # prefill + decode, e.g. the machine's cores or GPUs
    # A p90 past this share of its SLO is "near" (scale up); below low_water it is "quiet".
    high_water: float = 0.9
    low_water: float = 0.5
    queue_high: float = 2.0  # requests waiting per worker
    kv_high: float = 0.9
    down_after_intervals: int = 3
    # Fewer finished requests than this: percentiles are noise; queues and KV still count.
    min_requests: int = 5


@dataclass(frozen=True, slots=True)
class PlannerState:
    quiet_prefill: int = 0
    quiet_decode: int = 0
    # When each pool's target last changed (monotonic s).
    changed_prefill_s: float = float("-inf")
    changed_decode_s: float = float("-inf")
    # Each pool's size at the last decision (-1: none yet). Engines that register one by one (real vLLM engines
    # start tens of seconds apart on a busy host) must not inherit the quiet intervals counted at the smaller
    # size: measured, a graph's last prefill engine drained in the first decision after it registered.
    seen_prefill: int = -1
    seen_decode: int = -1


@dataclass(frozen=True, slots=True)
class PoolDecision:
    pool: Role
    current: int
    target: int
    # Signals that drove it, e.g. ("prefill_queue", "model"); () when unchanged for no reason.
    reasons: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return self.target != self.current


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    prefill: PoolDecision
    decode: PoolDecision
    state: PlannerState = field(default_factory=PlannerState)


def _near(value: float | None, limit: float, share: float) -> bool:
    return value is not None and value > limit * share


def _quiet(value: float | None, limit: float, share: float) -> bool:
    return value is None or value < limit * share


def pools_changed_s(obs: Observation, state: PlannerState) -> tuple[float, float]:
    """When each pool last changed (prefill, decode): now if its observed size differs from the last
    decision's, else when its target last changed."""
    return (obs.end_s if 0 <= state.seen_prefill != obs.num_prefill else state.changed_prefill_s,
            obs.end_s if 0 <= state.seen_decode != obs.num_decode else state.changed_decode_s)


def decide(obs: Observation, state: PlannerState, config: PlannerConfig,
           model: ModelTarget | None = None) -> ScaleDecision:
    slo, hw, lw = config.slo, config.high_water, config.low_water
    trusted = obs.num_finished >= config.min_requests
    window_start_s = obs.end_s - obs.duration_s
    changed_p_s, changed_d_s = pools_changed_s(obs, state)
    fresh_p = window_start_s >= changed_p_s
    fresh_d = window_start_s >= changed_d_s
    ttft_near = trusted and _near(obs.ttft_p90_ms, slo.ttft_ms, hw)
    itl_near = trusted and _near(obs.itl_p90_ms, slo.itl_ms, hw)

    prefill_up: list[str] = []
    if obs.num_prefill and obs.prefill_waiting > config.queue_high:
        prefill_up.append("prefill_queue")
    if fresh_p and ttft_near and obs.num_prefill and obs.prefill_waiting >= obs.decode_waiting:
        prefill_up.append("ttft")
    decode_up: list[str] = []
    if fresh_d and itl_near:
        decode_up.append("itl")
    if obs.decode_kv_usage > config.kv_high:
        decode_up.append("decode_kv")
    if obs.decode_waiting > config.queue_high:
        decode_up.append("decode_queue")
    if fresh_d and ttft_near and (not obs.num_prefill or obs.decode_waiting > obs.prefill_waiting):
        decode_up.append("ttft")

    model_p = model.num_prefill if model is not None else None
    model_d = model.num_decode if model is not None else None
    p_target, p_reasons = _grow(obs.num_prefill, prefill_up, model_p)
    d_target, d_reasons = _grow(obs.num_decode, decode_up, model_d)

    # Quiet: nothing near, queues empty, and the model (if any) sees room for one worker fewer. Too few
    # requests to trust a percentile, with empty queues, is quiet too: it is what an idle graph looks like.
    quiet_common = not trusted or _quiet(obs.ttft_p90_ms, slo.ttft_ms, lw)
    prefill_quiet = (fresh_p and not prefill_up and quiet_common and obs.prefill_waiting < 0.5
                     and (model_p is None or model_p < obs.num_prefill))
    decode_quiet = (fresh_d and not decode_up and quiet_common
                    and (not trusted or _quiet(obs.itl_p90_ms, slo.itl_ms, lw))
                    and obs.decode_waiting < 0.5 and obs.decode_kv_usage < config.kv_high * lw / hw
                    and (model_d is None or model_d < obs.num_decode))
    quiet_p = state.quiet_prefill + 1 if prefill_quiet else 0
    quiet_d = state.quiet_decode + 1 if decode_quiet else 0
    if p_target == obs.num_prefill and quiet_p >= config.down_after_intervals:
        p_target, p_reasons, quiet_p = obs.num_prefill - 1, ("quiet",), 0
    if d_target == obs.num_decode and quiet_d >= config.down_after_intervals:
        d_target, d_reasons, quiet_d = obs.num_decode - 1, ("quiet",), 0

    p_target = _clamp(p_target, config.min_prefill, config.max_prefill)
    d_target = _clamp(d_target, config.min_decode, config.max_decode)
    p_target, d_target = _fit_budget(obs, p_target, d_target, bool(prefill_up), config.max_workers)
    p_changed, d_changed = p_target != obs.num_prefill, d_target != obs.num_decode
    return ScaleDecision(
        prefill=PoolDecision("prefill", obs.num_prefill, p_target, p_reasons if p_changed else ()),
        decode=PoolDecision("decode", obs.num_decode, d_target, d_reasons if d_changed else ()),
        state=replace(state, quiet_prefill=quiet_p, quiet_decode=quiet_d,
                      changed_prefill_s=obs.end_s if p_changed else changed_p_s,
                      changed_decode_s=obs.end_s if d_changed else changed_d_s,
                      seen_prefill=obs.num_prefill, seen_decode=obs.num_decode),
    )


def _grow(current: int, signals: list[str], model_target: int | None) -> tuple[int, tuple[str, ...]]:
    target, reasons = current, list(signals)
    if signals:
        target = current + 1
    if model_target is not None and model_target > target:
        target = model_target
        reasons.append("model")
    return target, tuple(reasons)


def _clamp(n: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, n))


def _fit_budget(obs: Observation, p: int, d: int, prefill_first: bool, max_workers: int) -> tuple[int, int]:
    """Trim growth to ``max_workers``; when both pools grow past it, the pool whose queue is longer wins."""
    while p + d > max_workers:
        p_grew, d_grew = p > obs.num_prefill, d > obs.num_decode
        if p_grew and (not d_grew or not prefill_first or obs.decode_waiting > obs.prefill_waiting):
            p -= 1
        elif d_grew:
            d -= 1
        else:
            break  # already over budget without growing: leave the rest to scale-down
    return p, d
