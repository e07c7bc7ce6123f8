"""A profile as the planner reads it: the timing and plan options it implies, and the serving stack's
overheads added to its timing (``common.profile`` holds the document itself)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from common.profile import load_profile, timing_fields
from common.timing import TimingModel
from services.planner.workload import PlanOptions


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


def load_plan_inputs(path: Path, **overrides: Any) -> tuple[TimingModel, PlanOptions]:
    """The timing and plan options of a profile file (``splitserve plan`` and ``planner --profile``)."""
    doc = load_profile(path)
    return TimingModel.from_profile(timing_fields(doc)), options_from_profile(doc, **overrides)


def with_serving_overheads(timing: TimingModel, decode_step_overhead_s: float, prefill_overhead_s: float) -> TimingModel:
    """The engine's timing plus what the serving stack adds, measured on a running graph at low load.

    A profile times the bare engine; served, every decode step also pays the worker, connector and delivery
    (here ~10 ms a step on 2 shared cores), and every remote prefill the route, transfer set-up and first-token
    relay. Added to the model's constant terms (decode base, prefill per-step), the plan's formulas stay as they
    are. Negative measured overheads (noise) count as 0.
    """
    coeffs = list(timing.prefill_coeffs_s) or [0.0]
    coeffs[0] += max(0.0, prefill_overhead_s)
    return replace(timing, decode_base_s=timing.decode_base_s + max(0.0, decode_step_overhead_s),
                   prefill_coeffs_s=tuple(coeffs))
