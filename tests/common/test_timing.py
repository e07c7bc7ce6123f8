"""Timing model: formulas, speedup, transfer time, profiles, and defaults in docs/architecture.md#engines's range."""

from __future__ import annotations

import math

import pytest

from common.timing import TimingModel, fit_prefill_coeffs


def test_prefill_is_a_polynomial_of_new_tokens() -> None:
    timing = TimingModel(prefill_coeffs_s=(0.5, 0.25, 0.125))
    assert timing.prefill_s(0) == 0.0
    assert timing.prefill_s(2) == pytest.approx(0.5 + 0.5 + 0.5)


def test_decode_grows_with_batch_and_kv() -> None:
    timing = TimingModel(decode_base_s=0.01, decode_per_seq_s=0.001, decode_per_kv_token_s=1e-6)
    assert timing.decode_s(0, 1000) == 0.0
    assert timing.decode_s(4, 1000) == pytest.approx(0.01 + 0.004 + 0.001)


def test_step_sums_prefill_and_decode_and_divides_by_speedup() -> None:
    timing = TimingModel(prefill_coeffs_s=(0.0, 0.001), decode_base_s=0.02, decode_per_seq_s=0.0,
                         decode_per_kv_token_s=0.0, speedup=4.0)
    assert timing.step_s(100, 2, 50) == pytest.approx((0.1 + 0.02) / 4)


def test_infinite_speedup_means_no_delay() -> None:
    timing = TimingModel(speedup=math.inf)
    assert timing.step_s(4096, 64, 100_000) == 0.0
    assert timing.transfer_s(10**12) == 0.0


def test_transfer_is_latency_plus_bytes_over_bandwidth() -> None:
    timing = TimingModel(transfer_bandwidth_bytes_per_s=1e9, transfer_latency_s=0.001, speedup=2.0)
    assert timing.transfer_s(2_000_000) == pytest.approx((0.001 + 0.002) / 2)


def test_defaults_match_a_100m_model_on_two_cores() -> None:
    timing = TimingModel()
    assert 1400 <= 2048 / timing.prefill_s(2048) <= 2900  # prefill tokens/s
    assert 0.025 <= timing.decode_s(1, 512) <= 0.04  # seconds per step, one sequence
    assert 500 <= 32 / timing.decode_s(32, 32 * 512) <= 800  # decode tokens/s at 32 sequences


def test_from_profile_takes_fields_and_fits_samples() -> None:
    timing = TimingModel.from_profile({"prefill_coeffs_s": [0.1, 0.2], "speedup": 10})
    assert timing.prefill_coeffs_s == (0.1, 0.2) and timing.speedup == 10
    samples = [[n, 0.01 + 0.0005 * n + 1e-8 * n * n] for n in (16, 128, 512, 1024, 2048)]
    fitted = TimingModel.from_profile({"prefill_samples": samples})
    assert fitted.prefill_coeffs_s == pytest.approx((0.01, 0.0005, 1e-8), rel=1e-6, abs=1e-9)
    with pytest.raises(ValueError, match="unknown"):
        TimingModel.from_profile({"prefil_coeffs_s": [1.0]})
    with pytest.raises(ValueError):
        fit_prefill_coeffs([[1, 1.0], [2, 2.0]])
    with pytest.raises(ValueError):
        TimingModel(speedup=0)
