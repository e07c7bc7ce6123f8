"""Profiling through the Engine protocol (mock engine), the fit, and the files the CLI reads and writes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from services.planner.profile import (
    PROFILE_KIND,
    ProfileSpec,
    clip_spec,
    fit_timing,
    load_timing,
    profile_mock,
    timing_fields,
    write_profile,
)
from common.timing import TimingModel

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


def test_fit_recovers_an_exact_model() -> None:
    tm = TimingModel(prefill_coeffs_s=(0.004, 3e-4, 2e-8), decode_base_s=0.02, decode_per_seq_s=5e-4,
                     decode_per_kv_token_s=2e-7)
    prefill = [{"num_tokens": n, "seconds": tm.prefill_s(n)} for n in (32, 128, 512, 2048, 4096)]
    decode = [{"batch": b, "mean_context": c, "step_s": tm.decode_s(b, b * c)}
              for b, c in ((1, 136), (4, 136), (16, 136), (64, 136), (4, 1032), (4, 2056))]
    fields = fit_timing(prefill, decode)
    assert fields["prefill_coeffs_s"] == pytest.approx(tm.prefill_coeffs_s, rel=1e-6)
    assert fields["decode_base_s"] == pytest.approx(0.02, rel=1e-6)
    assert fields["decode_per_seq_s"] == pytest.approx(5e-4, rel=1e-6)
    assert fields["decode_per_kv_token_s"] == pytest.approx(2e-7, rel=1e-6)


def test_fit_drops_negative_terms() -> None:
    # Decode flat in batch and context: every slope would be noise; none may go negative.
    decode = [{"batch": b, "mean_context": c, "step_s": s}
              for b, c, s in ((1, 100, 0.0101), (8, 100, 0.0099), (4, 1000, 0.0100))]
    fields = fit_timing([], decode)
    assert min(fields["decode_base_s"], fields["decode_per_seq_s"], fields["decode_per_kv_token_s"]) >= 0
    assert fields["decode_base_s"] == pytest.approx(0.01, rel=0.05)


def test_clip_spec_fits_the_engine() -> None:
    spec = clip_spec(ProfileSpec(prefill_lengths=(32, 4096, 8192), decode_contexts=(512, 4096)), 4096)
    assert spec.prefill_lengths == (32, 4095)
    assert spec.decode_contexts == (512, 4096 - spec.decode_tokens)


def test_load_timing_reads_a_profile_or_a_flat_dict(tmp_path: Path, doc: dict) -> None:
    path = tmp_path / "p.json"
    write_profile(doc, path)
    timing = load_timing(path, speedup=4.0)
    assert timing.speedup == 4.0
    assert timing.decode_base_s == pytest.approx(doc["timing"]["decode_base_s"])
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps({"decode_base_s": 0.5}))
    assert load_timing(flat).decode_base_s == 0.5


def test_cli_profile_then_plan(tmp_path: Path) -> None:
    from cli.main import app

    out = tmp_path / "mock.json"
    runner = CliRunner()
    result = runner.invoke(app, ["profile", "--engine", "mock", "--quick", "--mock-speedup", "50",
                                 "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["conditions"]["engine"] == "mock"
    result = runner.invoke(app, ["plan", "--profile", str(out), "--isl", "512", "--osl", "64", "--rate", "5",
                                 "--slo", "ttft_ms=1000,itl_ms=50", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan["decision"]["mode"] in ("aggregated", "disaggregated")
    result = runner.invoke(app, ["plan", "--profile", str(out), "--isl", "128,2048", "--osl", "64",
                                 "--concurrency", "8", "--slo", "ttft_ms=1000,itl_ms=50"])
    assert result.exit_code == 0, result.output
    assert "recommendation:" in result.output
    result = runner.invoke(app, ["plan", "--profile", str(out), "--isl", "128", "--osl", "64", "--rate", "1",
                                 "--slo", "ttft_ms=1000"])
    assert result.exit_code == 2


def test_launcher_passes_the_mock_profile(tmp_path: Path) -> None:
    from cli.launcher import GraphSpec, worker_commands

    cmds = worker_commands(GraphSpec(engine="mock", mock_profile=tmp_path / "p.json"), tmp_path, "tcp://x:1")
    assert all(cmd[cmd.index("--mock-profile") + 1] == str(tmp_path / "p.json") for cmd in cmds)
    assert "--mock-profile" not in worker_commands(GraphSpec(engine="mock"), tmp_path, "tcp://x:1")[0]


def test_with_serving_overheads() -> None:
    from services.planner.profile import with_serving_overheads

    base = TimingModel(prefill_coeffs_s=(0.01, 0.001), decode_base_s=0.02, decode_per_seq_s=0.001)
    served = with_serving_overheads(base, decode_step_overhead_s=0.008, prefill_overhead_s=0.1)
    assert served.decode_s(2, 0) == pytest.approx(base.decode_s(2, 0) + 0.008)
    assert served.prefill_s(512) == pytest.approx(base.prefill_s(512) + 0.1)
    assert with_serving_overheads(base, -0.003, -0.01) == base  # noise below zero changes nothing
