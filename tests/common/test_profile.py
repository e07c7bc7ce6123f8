"""The profile document: the fit, and the files written and read back."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from common.profile import (
    PROFILE_KIND,
    build_document,
    fit_timing,
    load_timing,
    write_profile,
)
from common.timing import TimingModel


@dataclass(frozen=True)
class _Spec:
    decode_tokens: int = 10


@pytest.fixture()
def doc() -> dict:
    tm = TimingModel(decode_base_s=0.02)
    samples = {"prefill": [{"num_tokens": n, "seconds": tm.prefill_s(n)} for n in (32, 256, 1024)],
               "decode": [{"batch": b, "mean_context": 133, "step_s": tm.decode_s(b, b * 133)} for b in (1, 8, 32)],
               "elapsed_s": 1.5, "truncated": False, "loadavg_before": [0.0, 0.0, 0.0]}
    return build_document(samples, {"engine": "test"}, _Spec())


def test_document_holds_conditions_samples_timing_and_fit(doc: dict) -> None:
    assert doc["kind"] == PROFILE_KIND and doc["version"] == 1
    cond = doc["conditions"]
    assert cond["engine"] == "test" and cond["spec"] == {"decode_tokens": 10} and cond["truncated"] is False
    assert cond["machine"]["nproc"] >= 1 and "timestamp" in cond
    assert doc["timing"]["decode_base_s"] == pytest.approx(0.02, rel=1e-6)
    assert doc["fit"]["prefill_max_rel_err"] < 1e-6 and doc["fit"]["decode_max_rel_err"] < 1e-6


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


def test_load_timing_reads_a_profile_or_a_flat_dict(tmp_path: Path, doc: dict) -> None:
    path = tmp_path / "p.json"
    write_profile(doc, path)
    timing = load_timing(path, speedup=4.0)
    assert timing.speedup == 4.0
    assert timing.decode_base_s == pytest.approx(doc["timing"]["decode_base_s"])
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps({"decode_base_s": 0.5}))
    assert load_timing(flat).decode_base_s == 0.5


def test_tier_figures_seed_the_router_when_present(tmp_path: Path) -> None:
    from cli.cmd_router import _tier_config
    from common.profile import tier_fields
    from services.router.tier_credit import TierConfig

    assert tier_fields({"kind": "splitserve.profile"}) == {}
    doc = {"kind": "splitserve.profile", "tiers": {"host_bytes_per_s": 4e9, "disk_latency_s": 0.005,
                                                   "disk_bytes_per_s": None, "other": 1}}
    assert tier_fields(doc) == {"host_bytes_per_s": 4e9, "disk_latency_s": 0.005}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    assert _tier_config(path, None, None) == TierConfig(host_bytes_per_s=4e9, disk_latency_s=0.005)
    assert _tier_config(path, 1e9, 2e8) == TierConfig(host_bytes_per_s=1e9, disk_bytes_per_s=2e8,
                                                      disk_latency_s=0.005)  # flags over the profile
    assert _tier_config(None, None, None) == TierConfig()
    with pytest.raises(ValueError):
        tier_fields({"tiers": [1]})
