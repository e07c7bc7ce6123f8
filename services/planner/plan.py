"""Size prefill/decode pools from a profile: pure functions, seconds inside, milliseconds in results.

This module searches both modes and decides; its collaborators: ``workload`` (what is asked), ``queueing``
(M/G/1), ``capacity`` (one worker's formulas below), ``results`` (the named results), ``display``.

The engine's costs come from a ``TimingModel`` (the mock's model, fitted to a real profile by
``common.profile``): ``P(n)`` = seconds to prefill ``n`` prompt tokens in one step, ``D(b)`` =
seconds of one decode step of ``b`` sequences at the workload's mean context ``ctx = E[ISL] + E[OSL]/2``
(``timing.decode_s(b, b * ctx)``). A live planner can call the same functions with measured rates.

Model (every quantity a mean; ISL may be a distribution, given as equally weighted samples):

Prefill pool (requests whose uncached prompt exceeds the local-prefill threshold ``T``, a fraction ``f``):
  ``S = P(ISL)``; each of ``n_p`` workers is an M/G/1 queue with Poisson arrivals ``lam_w = f*lam/n_p``
  (a random split of a Poisson stream; one prompt per step, which ignores batching and so is
  conservative). Pollaczek-Khinchine:  ``Wq = lam_w * E[S^2] / (2 * (1 - lam_w * E[S]))``
  (M/D/1 when ISL is fixed: ``Wq = rho * S / (2 * (1 - rho))``); ``TTFT = E[S] + Wq``.
  The most a worker takes within the TTFT SLO solves ``Wq = slack = ttft - E[S]``:
  ``lam_max = 2 * slack / (E[S^2] + 2 * slack * E[S])``, so ``n_p = ceil(f * lam / lam_max)``.
  (KV transfer time is reported, not counted in TTFT: the prefill worker streams the first token.)

Decode pool: ``b*`` = the largest batch (<= max_batch) with ``D(b*) <= ITL SLO``. Little's law: decoding
  requests in flight ``C = lam * E[OSL] * D(b*)``, so ``n_d = ceil(C / b*)`` (exact for a ``D`` linear in
  ``b``: fewer workers have no steady batch within ``b*``). Predicted per-worker batch: the fixed point
  ``b = (lam / n_d) * E[OSL] * ITL(b)``, ``ITL(b) = D(max(b, 1)) / (1 - rho_local)``, where
  ``rho_local = (lam / n_d) * (1 - f) * E[P(ISL) | ISL <= T]`` is the decode worker's time spent on local
  prefills (0 when every prompt goes remote). Local requests' TTFT is modelled as in aggregated mode
  (M/G/1 wait among local prompts + ``P`` + one decode step). If either breaks its SLO, ``n_d`` grows until
  both hold. With every prompt local (``f = 0``) the decode pool *is* the aggregated plan.

Local-prefill threshold ``T``: the longest prompt whose one-step prefill, added to the decode step it
  lands in, keeps that step within the ITL SLO: ``D(b_run) + P(T) <= ITL``, with ``b_run`` the per-worker
  batch when every prefill goes remote; capped at the chunk size. ``T`` is computed first, then the pools.

Aggregated (every worker prefills and decodes, chunked prefill): per worker ``lam_a = lam / n``,
  ``rho_p = lam_a * E[P(ISL)]``; prefill chunks interleave with decode steps, adding prefill time to the
  steps at the rate prompts arrive: ``ITL = D(b) / (1 - rho_p)`` with ``b = lam_a * E[OSL] * ITL`` (fixed
  point); ``TTFT = E[S] + Wq(M/G/1, lam_a) + E[ceil(ISL / chunk)] * D(b)`` (a prompt's chunks each share a
  step with the decode batch). The worst step (``itl_max_ms``) is ``D(b) + P(min(ISL, chunk))``.

Decision: aggregated when every prompt is under ``T`` (prefill-light), when it needs fewer workers (often
tight TTFT with loose ITL: prefill spread over all workers, and ITL slack absorbs the stalls), or on a
tie (no transfers); disaggregated when it needs fewer workers or aggregated cannot meet the SLOs.

Concurrency instead of rate (closed loop of ``N`` clients): ``lam = N / (E[S] + E[OSL] * D(min(N, b*)))``,
the rate if requests took their unqueued prefill and decode at the planned batch (an upper bound, so
conservative sizing).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from common.timing import TimingModel
from services.planner.capacity import (
    decode_step_s,
    local_prefill_threshold,
    max_batch_within,
    prefill_moments,
    request_rate,
    steady_batch,
)
from services.planner.queueing import EPS, ceil_div, mg1_max_rate, mg1_wait_quantile_s, mg1_wait_s, smallest_workers
from services.planner.results import AggPlan, Decision, DecodePool, DisaggPlan, Plan, PrefillPool, to_ms
from services.planner.workload import PlanOptions, Slo, Workload


def plan_disaggregated(timing: TimingModel, workload: Workload, slo: Slo, rate: float,
                       options: PlanOptions = PlanOptions()) -> DisaggPlan:
    ttft_s, itl_s = slo.ttft_ms / 1e3, slo.itl_ms / 1e3
    ctx, osl = workload.context_mean, workload.osl_mean

    def infeasible(reason: str, threshold: int = 0) -> DisaggPlan:
        return DisaggPlan(False, reason, threshold, None, None, None, None, None, None, None, None)

    b_star = max_batch_within(timing, ctx, itl_s, options.max_batch)
    if b_star == 0:
        return infeasible("decode_step_exceeds_itl")
    step_star = decode_step_s(timing, b_star, ctx)
    concurrency = rate * osl * step_star
    n_lower = max(1, ceil_div(concurrency, b_star))
    # Threshold from the all-remote decode pool's running batch.
    b_run = steady_batch(timing, ctx, rate / n_lower, osl)
    threshold = local_prefill_threshold(timing, itl_s, decode_step_s(timing, b_run, ctx), options.chunk_tokens)
    remote = [n for n in workload.isl if n > threshold]
    local = [n for n in workload.isl if n <= threshold]
    f = len(remote) / len(workload.isl)
    local_mean_s, local_second_s2 = prefill_moments(timing, local)

    def decode_at(n: int) -> tuple[float, float, float, float]:
        """(batch, ITL, local-prefill utilisation, local requests' TTFT) of n decode workers."""
        lam_local = rate / n * (1 - f)
        rho_local = lam_local * local_mean_s
        if rho_local >= 1:
            return math.inf, math.inf, rho_local, math.inf
        b = steady_batch(timing, ctx, rate / n, osl, rho_local)
        if math.isinf(b):
            return b, math.inf, rho_local, math.inf
        step = decode_step_s(timing, b, ctx)
        # A local prompt (<= T <= chunk) queues behind local prompts, then shares one step with the batch.
        ttft = local_mean_s + mg1_wait_s(lam_local, local_mean_s, local_second_s2) + step if local else 0.0
        return b, step / (1 - rho_local), rho_local, ttft

    def decode_ok(n: int) -> bool:
        b, itl, _, ttft = decode_at(n)
        return b <= options.max_batch and itl <= itl_s * (1 + EPS) and ttft <= ttft_s * (1 + EPS)

    n_d = smallest_workers(decode_ok, n_lower, options.max_workers)
    if n_d is None:
        return infeasible("worker_limit", threshold)
    b, itl, rho_local, local_ttft = decode_at(n_d)

    mean_s, second_s2 = prefill_moments(timing, remote)
    rate_remote = rate * f
    if remote and mean_s >= ttft_s:
        return infeasible("prefill_exceeds_ttft", threshold)
    lam_max = mg1_max_rate(mean_s, second_s2, ttft_s - mean_s) if remote else math.inf
    n_p = ceil_div(rate_remote, lam_max) if remote else 0
    if n_p > options.max_workers:
        return infeasible("worker_limit", threshold)
    wait = mg1_wait_s(rate_remote / n_p, mean_s, second_s2) if n_p else 0.0
    prefill = PrefillPool(
        workers=n_p, remote_fraction=f, prefill_ms=mean_s * 1e3, wait_ms=to_ms(wait),
        ttft_ms=to_ms(mean_s + wait) if remote else None,
        utilization=rate_remote / n_p * mean_s if n_p else 0.0,
        max_rate_per_worker=lam_max if remote else None,
        max_tokens_per_s_per_worker=lam_max * sum(remote) / len(remote) if remote else None)
    decode = DecodePool(
        workers=n_d, max_batch_within_itl=b_star, step_ms_at_max_batch=step_star * 1e3, concurrency=concurrency,
        batch=b, itl_ms=to_ms(itl), local_prefill_utilization=rho_local,
        local_ttft_ms=to_ms(local_ttft) if local else None,
        max_rate_per_worker=b_star / (osl * step_star))
    total = n_p + n_d
    ttft = max(mean_s + wait if remote else 0.0, local_ttft)
    transfer = None
    if options.kv_bytes_per_token and remote:
        transfer = (options.transfer_latency_s
                    + options.kv_bytes_per_token * sum(remote) / len(remote) / options.transfer_bytes_per_s) * 1e3
    return DisaggPlan(True, None, threshold, prefill, decode, total, to_ms(ttft), to_ms(itl), transfer,
                      rate / total, rate * osl / total)


def _agg_at(timing: TimingModel, workload: Workload, rate: float, n: int, mean_s: float, second_s2: float,
            chunks: float, options: PlanOptions) -> tuple[float, float, float, float, float]:
    """(ttft_s, itl_s, itl_max_s, batch, rho_p) of n aggregated workers (inf where saturated)."""
    ctx, osl = workload.context_mean, workload.osl_mean
    lam = rate / n
    rho = lam * mean_s
    if rho >= 1:
        return math.inf, math.inf, math.inf, math.inf, rho
    b = steady_batch(timing, ctx, lam, osl, rho)
    if math.isinf(b):
        return math.inf, math.inf, math.inf, b, rho
    step = decode_step_s(timing, b, ctx)
    ttft = mean_s + mg1_wait_s(lam, mean_s, second_s2) + chunks * step
    chunk_s = timing.prefill_s(min(max(workload.isl), options.chunk_tokens))
    return ttft, step / (1 - rho), step + chunk_s, b, rho


def plan_aggregated(timing: TimingModel, workload: Workload, slo: Slo, rate: float,
                    options: PlanOptions = PlanOptions()) -> AggPlan:
    ttft_s, itl_s = slo.ttft_ms / 1e3, slo.itl_ms / 1e3
    mean_s, second_s2 = prefill_moments(timing, workload.isl)
    chunks = sum(math.ceil(n / options.chunk_tokens) for n in workload.isl) / len(workload.isl)

    def infeasible(reason: str) -> AggPlan:
        return AggPlan(False, reason, None, (), None, None, None, None, None, None, None)

    if decode_step_s(timing, 1, workload.context_mean) > itl_s:
        return infeasible("decode_step_exceeds_itl")
    if mean_s + chunks * decode_step_s(timing, 1, workload.context_mean) >= ttft_s:
        return infeasible("prefill_exceeds_ttft")

    def broken(n: int) -> tuple[str, ...]:
        ttft, itl, _, b, rho = _agg_at(timing, workload, rate, n, mean_s, second_s2, chunks, options)
        out = []
        if rho >= 1 or b > options.max_batch:
            out.append("capacity")
        if ttft > ttft_s * (1 + EPS):
            out.append("ttft")
        if itl > itl_s * (1 + EPS):
            out.append("itl")
        return tuple(out)

    n = smallest_workers(lambda k: not broken(k), 1, options.max_workers)
    if n is None:
        return infeasible("worker_limit")
    ttft, itl, itl_max, b, rho = _agg_at(timing, workload, rate, n, mean_s, second_s2, chunks, options)
    return AggPlan(True, None, n, broken(n - 1) if n > 1 else (), to_ms(ttft), to_ms(itl), to_ms(itl_max), b, rho,
                   rate / n, rate * workload.osl_mean / n)


def decide(disagg: DisaggPlan, agg: AggPlan) -> Decision:
    nd, na = disagg.total_workers, agg.workers
    if not disagg.feasible and not agg.feasible:
        return Decision("infeasible", ("both_infeasible",), nd, na)
    if not disagg.feasible:
        return Decision("aggregated", ("disaggregated_infeasible",), nd, na)
    if not agg.feasible:
        return Decision("disaggregated", ("aggregated_infeasible",), nd, na)
    assert nd is not None and na is not None and disagg.prefill is not None
    if disagg.prefill.workers == 0:
        return Decision("aggregated", ("prefill_light",), nd, na)
    if na <= nd:
        reasons = ["fewer_workers" if na < nd else "equal_workers"]
        if "ttft" in agg.bound_by and "itl" not in agg.bound_by:
            reasons.append("tight_ttft_loose_itl")
        return Decision("aggregated", tuple(reasons), nd, na)
    reasons = ["fewer_workers"]
    if "itl" in agg.bound_by:
        reasons.append("tight_itl")
    return Decision("disaggregated", tuple(reasons), nd, na)


def plan(timing: TimingModel, workload: Workload, slo: Slo, options: PlanOptions = PlanOptions()) -> Plan:
    rate = request_rate(timing, workload, slo, options)
    disagg = plan_disaggregated(timing, workload, slo, rate, options)
    agg = plan_aggregated(timing, workload, slo, rate, options)
    return Plan(rate, workload.isl_mean, workload.osl_mean, workload.context_mean, slo, disagg, agg,
                decide(disagg, agg))


def prefill_workers_for_quantile(timing: TimingModel, isl: Sequence[int], rate: float, ttft_s: float, q: float,
                                 max_workers: int) -> int | None:
    """Fewest prefill workers whose TTFT ``q``-quantile is within ``ttft_s``; 0 for no traffic; None when no
    count up to ``max_workers`` is. TTFT_q is taken as ``P_q + W_q`` (the prefill time's and the M/G/1 wait's
    quantiles: at least the quantile of their sum, so conservative); with a few long prompts among short
    ones, ``P_q`` is a long prompt's."""
    if rate <= 0 or not isl:
        return 0
    mean_s, second_s2 = prefill_moments(timing, isl)
    times = sorted(timing.prefill_s(n) for n in isl)
    p_q = times[min(len(times) - 1, math.ceil(q * len(times)) - 1)]
    if p_q >= ttft_s:
        return None
    return smallest_workers(lambda n: p_q + mg1_wait_quantile_s(rate / n, mean_s, second_s2, q) <= ttft_s,
                            1, max_workers)
