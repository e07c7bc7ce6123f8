"""A profile as the planner reads it: plan options from its conditions, timing plus serving overheads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.timing import TimingModel
from services.planner.profile import (
    load_plan_inputs,
    options_from_profile,
    with_serving_overheads,
)
from services.planner.workload import PlanOptions


def test_options_from_profile() -> None:
    doc = {"conditions": {"kv_bytes_per_token": 4096}, "decode": [{"batch": 1}, {"batch": 32}]}
    assert options_from_profile(doc) == PlanOptions(max_batch=32, kv_bytes_per_token=4096)
    assert options_from_profile(doc, max_batch=8, chunk_tokens=None).max_batch == 8


def test_load_plan_inputs(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"kind": "splitserve.profile", "timing": {"decode_base_s": 0.5},
                                "conditions": {"kv_bytes_per_token": 4096}, "decode": [{"batch": 16}]}))
    timing, options = load_plan_inputs(path, chunk_tokens=512)
    assert timing.decode_base_s == 0.5
    assert options == PlanOptions(max_batch=16, chunk_tokens=512, kv_bytes_per_token=4096)


def test_with_serving_overheads() -> None:
    base = TimingModel(prefill_coeffs_s=(0.01, 0.001), decode_base_s=0.02, decode_per_seq_s=0.001)
    served = with_serving_overheads(base, decode_step_overhead_s=0.008, prefill_overhead_s=0.1)
    assert served.decode_s(2, 0) == pytest.approx(base.decode_s(2, 0) + 0.008)
    assert served.prefill_s(512) == pytest.approx(base.prefill_s(512) + 0.1)
    assert with_serving_overheads(base, -0.003, -0.01) == base  # noise below zero changes nothing
