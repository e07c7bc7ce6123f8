"""Each pool's latency predicted from its live state: a "short" signal that moves when the load moves.

Latency percentiles over a window lag a load shift by most of the window (a 20 s window passes 90% of the
ITL SLO ~14 s after decode load doubles); the router's worker list is read each interval and already says
what each worker holds. With the profile (``TimingModel``):
  * decode: the step time at the pool's running sequences and the KV they attend, split evenly over its
    workers (the router balances them), at the sequence count projected ``horizon_s`` ahead from its growth
    over the last interval: a pool filling with long answers is short before its steps slow down;
    and, when the frontends count the arrivals' max_tokens, at the sequences the last interval's arrivals
    bring (Little's law, each counted no longer than the horizon): they show a phase change at the first
    decision after it, the count of decode sequences only once prefills have fed it and it has grown;
  * prefill: a new prompt's TTFT = the pool's queued prompt tokens (waiting, and the rest of running
    prefills) split over its workers, plus its own prompt, at the pool's prefill rate.
A pool is short when its prediction passes ``high_water`` of the SLO, and has a worker to spare when the
prediction with one worker fewer stays under ``low_water``: the gap between the two is the hysteresis that
keeps a pool near one size from flipping. Pure; table tests in tests/services/planner/test_predict.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from common.timing import TimingModel
from services.planner.policy import Observation, PoolDecision, ScaleDecision
from services.planner.workload import Slo

# Prompt length assumed before the frontend has counted any (a mid-sized prompt).
DEFAULT_ISL = 1024


@dataclass(frozen=True, slots=True)
class LiveConfig:
    # Decode load projected this far ahead: a phase change shows as +1-2 sequences/s in its first interval, and
    # the pool must be short then to move within two intervals (10 s saw it in the third).
    horizon_s: float = 20.0
    high_water: float = 0.9  # share of the SLO: short above
    low_water: float = 0.5  # ... spare below, with one worker fewer
    # Decisions in a row a donor must be spare (SwitchConfig.spare_intervals when these signals are read). 1
    # moved a worker on a one-decision blip of an idle decode pool (bench/results/planner-roles.json, run 2): 2.
    spare_intervals: int = 2


@dataclass(frozen=True, slots=True)
class LivePressure:
    """Predicted latencies (ms; None: the pool has no workers) and the verdicts they give."""

    itl_ms: float | None
    itl_one_less_ms: float | None  # with one decode worker fewer (inf: it is the last)
    ttft_ms: float | None
    ttft_one_less_ms: float | None
    projected_seqs: float  # decode sequences expected at the horizon
    decode_short: bool = False
    # Short at the sequences running now, without the growth projection (which assumes none finish within the
    # horizon, so it overshoots once a shift's first sequences start finishing).
    decode_short_now: bool = False
    decode_spare: bool = False
    prefill_short: bool = False
    prefill_spare: bool = False


def projected_seqs(num_seqs: int, num_seqs_before: int | None, dt_s: float, horizon_s: float) -> float:
    """Sequences expected ``horizon_s`` from now if the last interval's growth goes on; never below now
    (a shrinking pool is read as it is: its spare verdict waits for it to have shrunk)."""
    if num_seqs_before is None or dt_s <= 0:
        return float(num_seqs)
    return num_seqs + max(0.0, (num_seqs - num_seqs_before) / dt_s) * horizon_s


def arrival_seqs(timing: TimingModel, arrival_rps: float, osl: float, kv_per_seq: float, num_workers: int,
                 max_iters: int = 200) -> float:
    """Decode sequences the pool holds once the recent arrivals' rate goes on (Little's law): each stays ``osl``
    steps, a step's time growing with the sequences per worker, so per worker n = rate / workers x osl x
    step(n). The smallest such n (iterated from 0); inf when there is none (the steps slow faster than
    sequences finish: the pool cannot keep up) or it is not reached within ``max_iters``."""
    if arrival_rps <= 0 or osl <= 0:
        return 0.0
    if num_workers <= 0:
        return math.inf
    per_worker_rps = arrival_rps / num_workers
    n = 0.0
    for _ in range(max_iters):
        nxt = per_worker_rps * osl * timing.step_s(0, max(1, math.ceil(n)), round(max(1.0, n) * kv_per_seq))
        if abs(nxt - n) < 0.01:
            return nxt * num_workers
        n = nxt
        if n > 1e5:
            break
    return math.inf


def predicted_itl_ms(timing: TimingModel, num_seqs: float, num_kv_tokens: float, num_workers: int) -> float | None:
    """ms of one decode step with the pool's sequences and KV split evenly over ``num_workers``."""
    if num_workers <= 0:
        return None if num_workers == 0 else math.inf
    if math.isinf(num_seqs):
        return math.inf
    per_worker = math.ceil(num_seqs / num_workers)
    if per_worker <= 0:
        return 0.0
    return timing.step_s(0, per_worker, round(num_kv_tokens / num_workers)) * 1e3


def prefill_rate_tokens_per_s(timing: TimingModel, isl: float, measured_tokens_per_s: float = 0.0) -> float:
    """One worker's prefill rate: the engine's own measure when it reports one, else the profile's at ``isl``."""
    if measured_tokens_per_s > 0:
        return measured_tokens_per_s
    num_tokens = max(1, round(isl))
    step_s = timing.step_s(num_tokens, 0, 0)
    return num_tokens / step_s if step_s > 0 else math.inf


def predicted_ttft_ms(backlog_tokens: float, isl: float, num_workers: int, tokens_per_s: float) -> float | None:
    """ms until a new prompt of ``isl`` tokens has its first token: the queue ahead of it on a worker (the
    pool's backlog split evenly), then its own prefill."""
    if num_workers <= 0:
        return None if num_workers == 0 else math.inf
    return (backlog_tokens / num_workers + isl) / tokens_per_s * 1e3


def drop_lagging_model(decision: ScaleDecision, live: LivePressure, slo: Slo, config: LiveConfig) -> ScaleDecision:
    """The profile's target sizes the whole window, so after a phase change it keeps asking for the old phase's
    pool for most of a window: a pool that would grow for the model alone, while its predicted latency is
    under ``low_water``, does not (no worker is started for a phase that is over)."""

    def check(pool: PoolDecision, predicted_ms: float | None, slo_ms: float) -> PoolDecision:
        lagging = (pool.target > pool.current and set(pool.reasons) <= {"model"} and predicted_ms is not None
                   and predicted_ms < slo_ms * config.low_water)
        return replace(pool, target=pool.current, reasons=()) if lagging else pool

    return replace(decision, prefill=check(decision.prefill, live.ttft_ms, slo.ttft_ms),
                   decode=check(decision.decode, live.itl_ms, slo.itl_ms))


def live_pressure(obs: Observation, before: Observation | None, timing: TimingModel, slo: Slo,
                  config: LiveConfig) -> LivePressure:
    """Both pools' predicted latencies and verdicts from this interval's live state (``before``: the previous
    interval's, for the decode pool's growth)."""
    hw, lw = config.high_water, config.low_water
    n_d, n_p = obs.num_decode, obs.num_prefill
    dt_s = obs.end_s - before.end_s if before is not None else 0.0
    seqs = projected_seqs(obs.decode_seqs, before.decode_seqs if before is not None else None, dt_s, config.horizon_s)
    isl = obs.isl_mean if obs.isl_mean is not None else DEFAULT_ISL
    # KV per sequence: what the running ones attend now; a pool with none running expects prompts of ``isl``.
    running = obs.decode_kv_tokens and obs.decode_running
    kv_per_seq = obs.decode_kv_tokens / obs.decode_running if running else isl
    kv = seqs * kv_per_seq
    itl = predicted_itl_ms(timing, seqs, kv, n_d)
    itl_now = predicted_itl_ms(timing, obs.decode_seqs, obs.decode_seqs * kv_per_seq, n_d)
    itl_less = predicted_itl_ms(timing, seqs, kv, n_d - 1) if n_d > 1 else (math.inf if n_d else None)
    if obs.recent_max_tokens is not None and n_d > 0:
        # The arrivals' own decode load (their max_tokens), at their prompt plus half their answer of KV: it
        # shows an interval after a phase change, the count of decode sequences only once they have
        # reached the workers and piled up. Their steady state, each counted no longer than the horizon (a
        # phase shorter than the time to fill the pool must not move workers for a load it never reaches).
        osl = obs.recent_max_tokens
        kv_arrival = isl + osl / 2
        reach = obs.recent_arrival_rps * config.horizon_s
        steady = min(reach, arrival_seqs(timing, obs.recent_arrival_rps, osl, kv_arrival, n_d))
        itl_arrivals = predicted_itl_ms(timing, steady, steady * kv_arrival, n_d)
        if itl_arrivals is not None and itl is not None and itl_arrivals > itl:
            itl, seqs = itl_arrivals, max(seqs, steady)
        if n_d > 1:
            steady_less = min(reach, arrival_seqs(timing, obs.recent_arrival_rps, osl, kv_arrival, n_d - 1))
            less = predicted_itl_ms(timing, steady_less, steady_less * kv_arrival, n_d - 1)
            itl_less = max(itl_less, less) if less is not None and itl_less is not None else itl_less
    rate = prefill_rate_tokens_per_s(timing, isl, obs.prefill_tokens_per_s)
    ttft = predicted_ttft_ms(obs.prefill_backlog_tokens, isl, n_p, rate)
    ttft_less = predicted_ttft_ms(obs.prefill_backlog_tokens, isl, n_p - 1, rate) if n_p > 1 else (
        math.inf if n_p else None)
    return LivePressure(
        itl_ms=itl, itl_one_less_ms=itl_less, ttft_ms=ttft, ttft_one_less_ms=ttft_less, projected_seqs=seqs,
        decode_short=itl is not None and itl > slo.itl_ms * hw,
        decode_short_now=itl_now is not None and itl_now > slo.itl_ms * hw,
        decode_spare=itl_less is not None and itl_less < slo.itl_ms * lw,
        prefill_short=ttft is not None and ttft > slo.ttft_ms * hw,
        prefill_spare=ttft_less is not None and ttft_less < slo.ttft_ms * lw)
