"""Profiling through the Engine protocol (mock engine): the samples, and the fit that reproduces them."""

from __future__ import annotations

import asyncio

import pytest

from common.profile import PROFILE_KIND, timing_fields
from common.timing import TimingModel
from services.worker.engines.profile import ProfileSpec, clip_spec, profile_mock

# Small enough for a test (~3 s), slow enough (speedup 2) that asyncio overhead is a few % of a step.
SPEC = ProfileSpec(prefill_lengths=(32, 256, 1024), prefill_repeats=2, decode_batches=(1, 8, 32),
                   decode_batch_context=128, decode_contexts=(1024,), decode_context_batch=4, decode_tokens=10, decode_repeats=1,
                   warmup_requests=1, max_seconds=60)
TRUTH = TimingModel(speedup=2.0)


@pytest.fixture(scope="module")
def doc() -> dict:
    return asyncio.run(profile_mock(SPEC, TRUTH))


def test_profile_has_conditions_and_samples(doc: dict) -> None:
    assert doc["kind"] == PROFILE_KIND and doc["version"] == 1
    cond = doc["conditions"]
    for key in ("engine", "model", "dtype", "block_size", "machine", "timestamp", "max_num_batched_tokens",
                "kv_bytes_per_token", "spec", "elapsed_s", "truncated"):
        assert key in cond, key
    assert cond["engine"] == "mock" and cond["truncated"] is False
    assert cond["machine"]["nproc"] >= 1
    assert [p["num_tokens"] for p in doc["prefill"]] == [32, 256, 1024]
    assert all(len(p["all_seconds"]) == 2 for p in doc["prefill"])
    assert [(d["batch"], d["context"]) for d in doc["decode"]] == [(1, 128), (8, 128), (32, 128), (4, 1024)]
    assert all(d["mean_context"] == d["context"] + 5 for d in doc["decode"])
    assert set(doc["timing"]) == {"prefill_coeffs_s", "decode_base_s", "decode_per_seq_s", "decode_per_kv_token_s"}
    # Measured times are the mock's model (scaled) plus a little event-loop overhead.
    for p in doc["prefill"]:
        truth = TRUTH.step_s(p["num_tokens"], 0, 0)
        assert truth <= p["seconds"] <= truth * 2 + 0.005
    for d in doc["decode"]:
        truth = TRUTH.step_s(0, d["batch"], d["batch"] * d["mean_context"])
        assert truth * 0.9 <= d["step_s"] <= truth * 3 + 0.005  # Python per-sequence work on a shared machine


def test_fitted_timing_reproduces_the_profile_within_10_percent(doc: dict) -> None:
    fitted = TimingModel.from_profile(timing_fields(doc))
    for p in doc["prefill"]:
        assert fitted.prefill_s(p["num_tokens"]) == pytest.approx(p["seconds"], rel=0.10)
    for d in doc["decode"]:
        assert fitted.decode_s(d["batch"], d["batch"] * d["mean_context"]) == pytest.approx(d["step_s"], rel=0.10)
    assert doc["fit"]["prefill_max_rel_err"] <= 0.10 and doc["fit"]["decode_max_rel_err"] <= 0.10


def test_clip_spec_fits_the_engine() -> None:
    spec = clip_spec(ProfileSpec(prefill_lengths=(32, 4096, 8192), decode_contexts=(512, 4096)), 4096)
    assert spec.prefill_lengths == (32, 4095)
    assert spec.decode_contexts == (512, 4096 - spec.decode_tokens)
