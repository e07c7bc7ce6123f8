"""Size prefill/decode pools from a profile: pure functions, seconds inside, milliseconds in results.

The engine's costs come from a ``TimingModel`` (the mock's model, fitted to a real profile by
``services.planner.profile``): ``P(n)`` = seconds to prefill ``n`` prompt tokens in one step, ``D(b)`` =
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from common.timing import TimingModel

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Workload:
    isl: tuple[int, ...]  # equally weighted samples (one value: fixed ISL)
    osl: tuple[int, ...]
    rate: float | None = None  # requests/s (open loop)
    concurrency: int | None = None  # clients (closed loop)

    @classmethod
    def of(cls, isl: int | Sequence[int], osl: int | Sequence[int], rate: float | None = None,
           concurrency: int | None = None) -> Workload:
        isl_t = (int(isl),) if isinstance(isl, int) else tuple(int(x) for x in isl)
        osl_t = (int(osl),) if isinstance(osl, int) else tuple(int(x) for x in osl)
        if not isl_t or not osl_t or min(isl_t) < 1 or min(osl_t) < 1:
            raise ValueError("ISL and OSL need at least one sample, each >= 1")
        if (rate is None) == (concurrency is None):
            raise ValueError("give exactly one of rate and concurrency")
        if rate is not None and rate <= 0 or concurrency is not None and concurrency < 1:
            raise ValueError("rate must be > 0 and concurrency >= 1")
        return cls(isl_t, osl_t, rate, concurrency)

    @property
    def isl_mean(self) -> float:
        return sum(self.isl) / len(self.isl)

    @property
    def osl_mean(self) -> float:
        return sum(self.osl) / len(self.osl)

    @property
    def context_mean(self) -> float:
        """Mean tokens of KV a decoding sequence attends to."""
        return self.isl_mean + self.osl_mean / 2


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_ms: float
    itl_ms: float

    @classmethod
    def parse(cls, text: str) -> Slo:
        """``ttft_ms=500,itl_ms=50``."""
        values: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = part.partition("=")
            if not sep or key.strip() not in ("ttft_ms", "itl_ms"):
                raise ValueError(f"SLO part {part!r}: expected ttft_ms=.. or itl_ms=..")
            values[key.strip()] = float(value)
        if set(values) != {"ttft_ms", "itl_ms"}:
            raise ValueError(f"SLO {text!r} needs both ttft_ms and itl_ms")
        return cls(**values)


@dataclass(frozen=True, slots=True)
class PlanOptions:
    max_batch: int = 64  # decode sequences per worker (max_num_seqs, or the profile's largest batch)
    chunk_tokens: int = 2048  # max_num_batched_tokens: the prefill chunk of an aggregated worker
    kv_bytes_per_token: int = 0  # for the reported transfer time (0: not reported)
    transfer_bytes_per_s: float = 3.4e9  # docs/architecture.md#nixl-facts scattered NIXL read
    transfer_latency_s: float = 0.0005
    max_workers: int = 100_000


# ------------------------------------------------------------------------------------------ formulas


def mg1_wait_s(arrival_rate: float, mean_s: float, second_moment_s2: float) -> float:
    """Pollaczek-Khinchine mean wait of an M/G/1 queue; inf when saturated."""
    if arrival_rate <= 0:
        return 0.0
    rho = arrival_rate * mean_s
    if rho >= 1:
        return math.inf
    return arrival_rate * second_moment_s2 / (2 * (1 - rho))


def mg1_max_rate(mean_s: float, second_moment_s2: float, max_wait_s: float) -> float:
    """Largest arrival rate whose M/G/1 mean wait is <= ``max_wait_s`` (0 when none is)."""
    if max_wait_s < 0 or mean_s <= 0 and second_moment_s2 <= 0:
        return 0.0 if max_wait_s < 0 else math.inf
    return 2 * max_wait_s / (second_moment_s2 + 2 * max_wait_s * mean_s)


def mg1_wait_quantile_s(arrival_rate: float, mean_s: float, second_moment_s2: float, q: float) -> float:
    """Approximate ``q``-quantile of the M/G/1 wait (the live planner's SLOs are p90s, not means).

    A request waits at all with probability ``rho``; the wait of those that do is taken as exponential with
    mean ``Wq / rho`` (Kingman's heavy-traffic tail). So the quantile is 0 while ``rho <= 1 - q``, else
    ``(Wq / rho) * ln(rho / (1 - q))``; inf when saturated.
    """
    rho = arrival_rate * mean_s
    if rho >= 1:
        return math.inf
    if rho <= 1 - q:
        return 0.0
    return mg1_wait_s(arrival_rate, mean_s, second_moment_s2) / rho * math.log(rho / (1 - q))


def ceil_div(x: float, y: float) -> int:
    """ceil(x / y), forgiving float noise (4.0000000001 -> 4)."""
    return max(0, math.ceil(x / y - _EPS))


def decode_step_s(timing: TimingModel, batch: float, context: float) -> float:
    """``D(b)``: one decode step of ``batch`` sequences of ``context`` tokens (a batch below 1 counts as 1)."""
    b = max(batch, 1.0)
    return timing.decode_s(b, b * context)  # type: ignore[arg-type]


def max_batch_within(timing: TimingModel, context: float, itl_s: float, max_batch: int) -> int:
    """``b*``: the largest batch in [1, max_batch] whose step meets ``itl_s``; 0 when batch 1 does not."""
    best = 0
    for b in range(1, max_batch + 1):
        if decode_step_s(timing, b, context) <= itl_s + _EPS * itl_s:
            best = b
        else:
            break
    return best


def steady_batch(timing: TimingModel, context: float, rate_per_worker: float, osl: float,
                 stall: float = 0.0, limit: float = 1e7) -> float:
    """Mean decode batch ``b = rate * osl * D(b) / (1 - stall)`` (least fixed point); inf if none."""
    if stall >= 1:
        return math.inf
    b = 0.0
    for _ in range(100_000):
        nxt = rate_per_worker * osl * decode_step_s(timing, b, context) / (1 - stall)
        if nxt > limit:
            return math.inf
        if abs(nxt - b) <= 1e-13 * max(1.0, nxt):
            return nxt
        b = nxt
    return math.inf


def prefill_moments(timing: TimingModel, isl: Sequence[int]) -> tuple[float, float]:
    """E[P(ISL)] and E[P(ISL)^2] over equally weighted samples (0, 0 for none)."""
    if not isl:
        return 0.0, 0.0
    times = [timing.prefill_s(n) for n in isl]
    return sum(times) / len(times), sum(t * t for t in times) / len(times)


def local_prefill_threshold(timing: TimingModel, itl_s: float, step_s: float, max_tokens: int) -> int:
    """Largest ``n <= max_tokens`` with ``step_s + P(n) <= itl_s`` (P increasing); 0 if none."""
    slack = itl_s - step_s
    if slack <= 0:
        return 0
    lo, hi = 0, max_tokens
    if timing.prefill_s(hi) <= slack:
        return hi
    while hi - lo > 1:  # P(lo) <= slack < P(hi)
        mid = (lo + hi) // 2
        if timing.prefill_s(mid) <= slack:
            lo = mid
        else:
            hi = mid
    return lo


def smallest_workers(ok: Callable[[int], bool], lo: int, hi: int) -> int | None:
    """The smallest n in [lo, hi] with ok(n), for ok monotone in n (doubling, then bisection)."""
    lo = max(lo, 1)
    if lo > hi:
        return None
    if ok(lo):
        return lo
    step = 1
    bad = lo
    while True:
        cand = min(lo + step, hi)
        if ok(cand):
            good = cand
            break
        bad = cand
        if cand == hi:
            return None
        step *= 2
    while good - bad > 1:
        mid = (good + bad) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good


def request_rate(timing: TimingModel, workload: Workload, slo: Slo, options: PlanOptions) -> float:
    """Arrival rate: given, or a closed loop's ``N / (E[S] + E[OSL] * D(min(N, b*)))``."""
    if workload.rate is not None:
        return workload.rate
    assert workload.concurrency is not None
    ctx = workload.context_mean
    b_star = max(1, max_batch_within(timing, ctx, slo.itl_ms / 1e3, options.max_batch))
    batch = min(workload.concurrency, b_star)
    mean_s, _ = prefill_moments(timing, workload.isl)
    return workload.concurrency / (mean_s + workload.osl_mean * decode_step_s(timing, batch, ctx))


# ------------------------------------------------------------------------------------------- results


def _ms(seconds: float) -> float | None:
    return None if math.isinf(seconds) or math.isnan(seconds) else seconds * 1e3


@dataclass(frozen=True, slots=True)
class PrefillPool:
    workers: int
    remote_fraction: float  # share of requests prefilled here (ISL > threshold)
    prefill_ms: float  # E[P(ISL)] over the remote requests
    wait_ms: float | None  # M/G/1 mean queueing
    ttft_ms: float | None
    utilization: float
    max_rate_per_worker: float | None  # requests/s one worker takes within the TTFT SLO
    max_tokens_per_s_per_worker: float | None


@dataclass(frozen=True, slots=True)
class DecodePool:
    workers: int
    max_batch_within_itl: int  # b*
    step_ms_at_max_batch: float | None
    concurrency: float  # lam * E[OSL] * D(b*)
    batch: float | None  # predicted mean per-worker batch
    itl_ms: float | None
    local_prefill_utilization: float
    local_ttft_ms: float | None  # requests prefilled on the decode worker
    max_rate_per_worker: float | None  # b* / (E[OSL] * D(b*))


@dataclass(frozen=True, slots=True)
class DisaggPlan:
    feasible: bool
    infeasible_reason: str | None  # prefill_exceeds_ttft | decode_step_exceeds_itl | worker_limit
    local_prefill_max_tokens: int
    prefill: PrefillPool | None
    decode: DecodePool | None
    total_workers: int | None
    ttft_ms: float | None  # the worse of remote and local requests
    itl_ms: float | None
    kv_transfer_ms: float | None
    goodput_rps_per_worker: float | None
    output_tokens_per_s_per_worker: float | None


@dataclass(frozen=True, slots=True)
class AggPlan:
    feasible: bool
    infeasible_reason: str | None  # prefill_exceeds_ttft | decode_step_exceeds_itl | worker_limit
    workers: int | None
    # The SLOs one worker fewer would break ("capacity": prefill saturated or batch over max_batch).
    bound_by: tuple[str, ...]
    ttft_ms: float | None
    itl_ms: float | None
    itl_max_ms: float | None  # a step carrying a full prefill chunk
    batch: float | None
    prefill_utilization: float | None
    goodput_rps_per_worker: float | None
    output_tokens_per_s_per_worker: float | None


Mode = Literal["aggregated", "disaggregated", "infeasible"]


@dataclass(frozen=True, slots=True)
class Decision:
    mode: Mode
    # Codes: prefill_light, fewer_workers, equal_workers, tight_ttft_loose_itl, tight_itl,
    # aggregated_infeasible, disaggregated_infeasible, both_infeasible.
    reasons: tuple[str, ...]
    workers_disaggregated: int | None
    workers_aggregated: int | None


@dataclass(frozen=True, slots=True)
class Plan:
    rate: float
    isl_mean: float
    osl_mean: float
    context_mean: float
    slo: Slo
    disaggregated: DisaggPlan
    aggregated: AggPlan
    decision: Decision

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ----------------------------------------------------------------------------------------- planners


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
        return b <= options.max_batch and itl <= itl_s * (1 + _EPS) and ttft <= ttft_s * (1 + _EPS)

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
        workers=n_p, remote_fraction=f, prefill_ms=mean_s * 1e3, wait_ms=_ms(wait),
        ttft_ms=_ms(mean_s + wait) if remote else None,
        utilization=rate_remote / n_p * mean_s if n_p else 0.0,
        max_rate_per_worker=lam_max if remote else None,
        max_tokens_per_s_per_worker=lam_max * sum(remote) / len(remote) if remote else None)
    decode = DecodePool(
        workers=n_d, max_batch_within_itl=b_star, step_ms_at_max_batch=step_star * 1e3, concurrency=concurrency,
        batch=b, itl_ms=_ms(itl), local_prefill_utilization=rho_local, local_ttft_ms=_ms(local_ttft) if local else None,
        max_rate_per_worker=b_star / (osl * step_star))
    total = n_p + n_d
    ttft = max(mean_s + wait if remote else 0.0, local_ttft)
    transfer = None
    if options.kv_bytes_per_token and remote:
        transfer = (options.transfer_latency_s
                    + options.kv_bytes_per_token * sum(remote) / len(remote) / options.transfer_bytes_per_s) * 1e3
    return DisaggPlan(True, None, threshold, prefill, decode, total, _ms(ttft), _ms(itl), transfer,
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
        if ttft > ttft_s * (1 + _EPS):
            out.append("ttft")
        if itl > itl_s * (1 + _EPS):
            out.append("itl")
        return tuple(out)

    n = smallest_workers(lambda k: not broken(k), 1, options.max_workers)
    if n is None:
        return infeasible("worker_limit")
    ttft, itl, itl_max, b, rho = _agg_at(timing, workload, rate, n, mean_s, second_s2, chunks, options)
    return AggPlan(True, None, n, broken(n - 1) if n > 1 else (), _ms(ttft), _ms(itl), _ms(itl_max), b, rho,
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


def options_from_profile(doc: Mapping[str, Any], **overrides: Any) -> PlanOptions:
    """PlanOptions from a profile's conditions: largest measured batch, chunk size, KV bytes per token."""
    cond = doc.get("conditions", {})
    batches = [int(d["batch"]) for d in doc.get("decode", [])]
    kwargs: dict[str, Any] = {}
    if batches:
        kwargs["max_batch"] = max(batches)
    if cond.get("kv_bytes_per_token"):
        kwargs["kv_bytes_per_token"] = int(cond["kv_bytes_per_token"])
    kwargs.update({k: v for k, v in overrides.items() if v is not None})
    return PlanOptions(**kwargs)


# ------------------------------------------------------------------------------------------- display


def format_plan(p: Plan) -> str:
    def f(x: float | None, fmt: str = ".1f") -> str:
        return "-" if x is None else format(x, fmt)

    d, a, dec = p.disaggregated, p.aggregated, p.decision
    lines = [f"workload: rate {p.rate:.3g} req/s, ISL {p.isl_mean:.0f}, OSL {p.osl_mean:.0f}, "
             f"mean context {p.context_mean:.0f}; SLO TTFT {p.slo.ttft_ms:g} ms, ITL {p.slo.itl_ms:g} ms", ""]
    rows = [("", "disaggregated", "aggregated")]
    if d.feasible and d.prefill and d.decode:
        dw = f"{d.prefill.workers}P + {d.decode.workers}D = {d.total_workers}"
    else:
        dw = f"infeasible ({d.infeasible_reason})"
    aw = f"{a.workers}" if a.feasible else f"infeasible ({a.infeasible_reason})"
    rows.append(("workers", dw, aw))
    rows.append(("TTFT ms", f(d.ttft_ms), f(a.ttft_ms)))
    rows.append(("ITL ms", f(d.itl_ms), f(a.itl_ms) + (f" (max {f(a.itl_max_ms)})" if a.feasible else "")))
    rows.append(("decode batch/worker", f(d.decode.batch if d.decode else None, ".2f"), f(a.batch, ".2f")))
    rows.append(("goodput req/s/worker", f(d.goodput_rps_per_worker, ".3g"), f(a.goodput_rps_per_worker, ".3g")))
    rows.append(("output tok/s/worker", f(d.output_tokens_per_s_per_worker, ".4g"),
                 f(a.output_tokens_per_s_per_worker, ".4g")))
    if d.prefill:
        rows.append(("prefill util / cap", f"{d.prefill.utilization:.2f} / "
                     f"{f(d.prefill.max_rate_per_worker, '.3g')} req/s", f(a.prefill_utilization, ".2f")))
    if d.decode:
        rows.append(("decode b* / step ms", f"{d.decode.max_batch_within_itl} / {f(d.decode.step_ms_at_max_batch)}",
                     ""))
    rows.append(("local prefill <= tokens", str(d.local_prefill_max_tokens), "all"))
    if d.kv_transfer_ms is not None:
        rows.append(("KV transfer ms", f(d.kv_transfer_ms, ".2f"), ""))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines += ["", f"recommendation: {dec.mode} ({', '.join(dec.reasons)})"]
    if a.feasible and a.bound_by:
        lines.append(f"aggregated is bound by: {', '.join(a.bound_by)}")
    return "\n".join(lines)
