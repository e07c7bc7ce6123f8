"""The plan's named results: each pool's size and predictions, both modes, and the decision between them
(milliseconds; ``None`` where a value is infinite or does not apply)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

from services.planner.workload import Slo


def to_ms(seconds: float) -> float | None:
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
