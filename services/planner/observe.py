"""What the live planner sees: frontend ``/metrics`` scraped each interval, and the router's worker list.

Frontends already export everything a planner needs as Prometheus counters and histograms, so the planner
reads the same numbers a Grafana dashboard shows, from any number of frontends (summed), and an operator
can check its inputs. One interval = the difference of two scrapes. Pure functions on parsed text.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from common.protocol import WorkerList
from services.planner.policy import Observation

_TTFT = "splitserve_frontend_ttft_seconds"
_ITL = "splitserve_frontend_itl_seconds"
_E2E = "splitserve_frontend_request_seconds"
_PROMPT = "splitserve_frontend_prompt_tokens"
_OUTPUT = "splitserve_frontend_output_tokens"
_INFLIGHT = "splitserve_frontend_inflight_requests"
_ISL = "splitserve_frontend_arrival_prompt_tokens"
_MAX_TOKENS = "splitserve_frontend_arrival_max_tokens"
# At most this many ISL samples per observation (the plan's cost is linear in them).
MAX_ISL_SAMPLES = 512

Buckets = tuple[tuple[float, float], ...]  # (upper bound s, cumulative count), ascending, last = +Inf


@dataclass(frozen=True, slots=True)
class FrontendSnapshot:
    """Cumulative values of one scrape (several frontends: summed)."""

    ttft: Buckets
    itl: Buckets
    num_finished: float
    prompt_tokens: float
    output_tokens: float
    inflight: float
    isl: Buckets = ()  # prompt tokens of arrivals: (upper bound, cumulative count); _count = arrivals
    isl_sum: float = 0.0
    max_tokens_count: float = 0.0  # arrivals that set max_tokens (each choice counted)
    max_tokens_sum: float = 0.0  # ... and the max_tokens they set


def parse_metrics(text: str) -> FrontendSnapshot:
    buckets: dict[str, dict[float, float]] = {_TTFT: {}, _ITL: {}, _ISL: {}}
    values = {_E2E: 0.0, _PROMPT: 0.0, _OUTPUT: 0.0, _INFLIGHT: 0.0, _ISL: 0.0, _MAX_TOKENS: 0.0,
              _MAX_TOKENS + "_count": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name.endswith("_bucket") and name[: -len("_bucket")] in buckets:
                le = float(sample.labels["le"])
                hist = buckets[name[: -len("_bucket")]]
                hist[le] = hist.get(le, 0.0) + sample.value
            elif name == _E2E + "_count":
                values[_E2E] += sample.value
            elif name == _ISL + "_sum":
                values[_ISL] += sample.value
            elif name == _MAX_TOKENS + "_sum":
                values[_MAX_TOKENS] += sample.value
            elif name == _MAX_TOKENS + "_count":
                values[name] += sample.value
            elif name in (_PROMPT + "_total", _OUTPUT + "_total", _INFLIGHT):
                values[name.removesuffix("_total")] += sample.value
    return FrontendSnapshot(
        ttft=tuple(sorted(buckets[_TTFT].items())), itl=tuple(sorted(buckets[_ITL].items())),
        num_finished=values[_E2E], prompt_tokens=values[_PROMPT], output_tokens=values[_OUTPUT],
        inflight=values[_INFLIGHT], isl=tuple(sorted(buckets[_ISL].items())), isl_sum=values[_ISL],
        max_tokens_count=values[_MAX_TOKENS + "_count"], max_tokens_sum=values[_MAX_TOKENS])


def merge(snapshots: Iterable[FrontendSnapshot]) -> FrontendSnapshot:
    snaps = list(snapshots)

    def add(hists: Sequence[Buckets]) -> Buckets:
        total: dict[float, float] = {}
        for hist in hists:
            for le, count in hist:
                total[le] = total.get(le, 0.0) + count
        return tuple(sorted(total.items()))

    return FrontendSnapshot(ttft=add([s.ttft for s in snaps]), itl=add([s.itl for s in snaps]),
                            num_finished=sum(s.num_finished for s in snaps),
                            prompt_tokens=sum(s.prompt_tokens for s in snaps),
                            output_tokens=sum(s.output_tokens for s in snaps), inflight=sum(s.inflight for s in snaps),
                            isl=add([s.isl for s in snaps]), isl_sum=sum(s.isl_sum for s in snaps),
                            max_tokens_count=sum(s.max_tokens_count for s in snaps),
                            max_tokens_sum=sum(s.max_tokens_sum for s in snaps))


def bucket_delta(now: Buckets, before: Buckets) -> Buckets:
    prev = dict(before)
    return tuple((le, count - prev.get(le, 0.0)) for le, count in now)


def quantile(buckets: Buckets, q: float) -> float | None:
    """Prometheus ``histogram_quantile``: linear inside the bucket holding rank ``q``; None if empty.

    A rank in the +Inf bucket answers the largest finite bound (the histogram knows no more).
    """
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_le, lower_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower_le
            if count == lower_count:
                return le
            return lower_le + (le - lower_le) * (rank - lower_count) / (count - lower_count)
        lower_le, lower_count = le, count
    return lower_le


def bucket_samples(buckets: Buckets, max_samples: int) -> tuple[int, ...]:
    """Equally weighted samples of a histogram, each at its bucket's upper bound (a conservative ISL: the
    prefill it predicts is never shorter); at most ``max_samples``, in proportion. +Inf counts as the largest
    finite bound."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return ()
    scale = min(1.0, max_samples / total)
    out: list[int] = []
    prev_count, last_finite = 0.0, 0.0
    for le, count in buckets:
        value = last_finite if math.isinf(le) else le
        last_finite = value
        n = round((count - prev_count) * scale)
        out.extend([int(value)] * n)
        prev_count = count
    return tuple(out)


def recent_arrivals(before: FrontendSnapshot, now: FrontendSnapshot, duration_s: float) -> tuple[float, float | None]:
    """Arrivals per second between two scrapes an interval apart, and the mean max_tokens of those that set one
    (None: none did). The decode load they bring shows here when they arrive, a prefill later on the workers."""
    arrivals = (now.isl[-1][1] if now.isl else 0.0) - (before.isl[-1][1] if before.isl else 0.0)
    rate = arrivals / duration_s if duration_s > 0 else 0.0
    num_set = now.max_tokens_count - before.max_tokens_count
    return rate, (now.max_tokens_sum - before.max_tokens_sum) / num_set if num_set > 0 else None


def observe(before: FrontendSnapshot, now: FrontendSnapshot, duration_s: float, workers: WorkerList,
            recent: tuple[FrontendSnapshot, float] | None = None) -> Observation:
    """``recent``: the scrape about one interval before ``now`` and its age (s), for the arrivals since."""
    finished = now.num_finished - before.num_finished
    ttft_p90 = quantile(bucket_delta(now.ttft, before.ttft), 0.9)
    itl_p90 = quantile(bucket_delta(now.itl, before.itl), 0.9)
    draining = set(workers.draining)
    prefill = [load for info, load in zip(workers.workers, workers.loads)
               if info.role == "prefill" and info.worker_id not in draining]
    decode_pairs = [(info, load) for info, load in zip(workers.workers, workers.loads)
                    if info.role in ("decode", "both") and info.worker_id not in draining]
    decode = [load for _, load in decode_pairs]

    def mean(xs: Sequence[float]) -> float:
        return sum(xs) / len(xs) if xs else 0.0

    isl = bucket_delta(now.isl, before.isl)
    arrivals = isl[-1][1] if isl else 0.0
    isl_mean = (now.isl_sum - before.isl_sum) / arrivals if arrivals > 0 else None
    # A worker that does not count its queued tokens (-1): its waiting requests at the window's mean prompt.
    backlog = sum(load.num_waiting_tokens if load.num_waiting_tokens >= 0
                  else load.num_waiting * (isl_mean or 0.0) for load in prefill)
    rates = [load.prefill_tokens_per_s for load in prefill if load.prefill_tokens_per_s > 0]
    recent_rps, recent_max_tokens = recent_arrivals(recent[0], now, recent[1]) if recent else (0.0, None)
    return Observation(
        duration_s=duration_s, num_finished=int(finished),
        arrival_rate_rps=arrivals / duration_s if duration_s > 0 else 0.0,
        # ISL of what arrives (the mix the pools are about to see); OSL of what finished (known only then).
        isl_mean=isl_mean,
        isl_samples=bucket_samples(isl, MAX_ISL_SAMPLES),
        osl_mean=(now.output_tokens - before.output_tokens) / finished if finished > 0 else None,
        ttft_p90_ms=None if ttft_p90 is None else ttft_p90 * 1e3,
        itl_p90_ms=None if itl_p90 is None else itl_p90 * 1e3,
        num_prefill=len(prefill), num_decode=len(decode),
        prefill_waiting=mean([load.num_waiting for load in prefill]),
        decode_waiting=mean([load.num_waiting for load in decode]),
        decode_kv_usage=mean([1 - load.num_free_blocks / load.num_total_blocks
                              for load in decode if load.num_total_blocks]),
        decode_seqs=sum(load.num_running + load.num_waiting for load in decode),
        decode_running=sum(load.num_running for load in decode),
        decode_kv_tokens=sum(load.num_active_blocks * info.block_size for info, load in decode_pairs),
        prefill_backlog_tokens=float(backlog), prefill_tokens_per_s=mean(rates),
        recent_arrival_rps=recent_rps, recent_max_tokens=recent_max_tokens,
    )
