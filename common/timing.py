"""Simulated step and transfer times of the mock engine.

Defaults are roughly a ~100M-parameter model on two CPU cores (docs/architecture.md#engines): prefill ~2k tokens/s, decode
~30 ms per step at small batch, ~50 ms at 32 sequences; transfers at NIXL's scattered-read bandwidth.
``speedup`` divides every time; ``float('inf')`` makes them all zero.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

import numpy as np


@dataclass(frozen=True, slots=True)
class TimingModel:
    # Prefill seconds = sum(c[i] * num_prefill_tokens**i): c[0] per-step overhead, c[1] per token, c[2]
    # the attention term that grows with chunk length.
    prefill_coeffs_s: tuple[float, ...] = (0.005, 0.00045, 2.0e-8)
    # Decode seconds = base + per_seq * num_decode_seqs + per_kv_token * num_kv_tokens attended.
    decode_base_s: float = 0.028
    decode_per_seq_s: float = 0.0007
    decode_per_kv_token_s: float = 1.0e-7
    transfer_bandwidth_bytes_per_s: float = 3.4e9
    transfer_latency_s: float = 0.0005
    # Simulated time is divided by this; inf means no delay at all.
    speedup: float = 1.0

    def __post_init__(self) -> None:
        if not self.speedup > 0:
            raise ValueError(f"speedup must be positive, got {self.speedup}")
        if not self.transfer_bandwidth_bytes_per_s > 0:
            raise ValueError("transfer_bandwidth_bytes_per_s must be positive")

    def prefill_s(self, num_prefill_tokens: int) -> float:
        """Unscaled seconds to compute ``num_prefill_tokens`` prompt tokens in one step (0 for none)."""
        if num_prefill_tokens <= 0:
            return 0.0
        return sum(coeff * num_prefill_tokens**power for power, coeff in enumerate(self.prefill_coeffs_s))

    def decode_s(self, num_decode_seqs: int, num_kv_tokens: int) -> float:
        """Unscaled seconds of one decode step over ``num_decode_seqs`` sequences (0 for none)."""
        if num_decode_seqs <= 0:
            return 0.0
        return (
            self.decode_base_s
            + self.decode_per_seq_s * num_decode_seqs
            + self.decode_per_kv_token_s * num_kv_tokens
        )

    def step_s(self, num_prefill_tokens: int, num_decode_seqs: int, num_kv_tokens: int) -> float:
        """Scaled wall seconds of one mixed step."""
        raw_s = self.prefill_s(num_prefill_tokens) + self.decode_s(num_decode_seqs, num_kv_tokens)
        return self._scale(raw_s)

    def transfer_s(self, num_bytes: int) -> float:
        """Scaled wall seconds to pull ``num_bytes`` of KV from a peer."""
        raw_s = self.transfer_latency_s + num_bytes / self.transfer_bandwidth_bytes_per_s
        return self._scale(raw_s)

    def _scale(self, raw_s: float) -> float:
        return 0.0 if math.isinf(self.speedup) else raw_s / self.speedup

    @classmethod
    def from_profile(cls, profile: Mapping[str, object]) -> TimingModel:
        """Build from a profile: any of the field names, plus optional ``prefill_samples``.

        ``prefill_samples`` is a list of ``[num_tokens, seconds]`` measured on the real engine; a
        quadratic is fitted to it (least squares) and replaces ``prefill_coeffs_s``.
        """
        known = {field.name for field in fields(cls)}
        unknown = set(profile) - known - {"prefill_samples"}
        if unknown:
            raise ValueError(f"unknown timing profile keys: {sorted(unknown)}")
        kwargs: dict[str, object] = {key: value for key, value in profile.items() if key in known}
        coeffs = kwargs.get("prefill_coeffs_s")
        if coeffs is not None:
            kwargs["prefill_coeffs_s"] = tuple(float(c) for c in coeffs)  # type: ignore[attr-defined]
        samples = profile.get("prefill_samples")
        if samples is not None:
            kwargs["prefill_coeffs_s"] = fit_prefill_coeffs(samples)  # type: ignore[arg-type]
        return cls(**kwargs)  # type: ignore[arg-type]


def fit_prefill_coeffs(samples: Sequence[Sequence[float]], degree: int = 2) -> tuple[float, ...]:
    """Least-squares polynomial (lowest power first) through ``(num_tokens, seconds)`` samples."""
    if len(samples) <= degree:
        raise ValueError(f"need more than {degree} prefill samples, got {len(samples)}")
    points = np.asarray(samples, dtype=np.float64)
    coeffs = np.polynomial.polynomial.polyfit(points[:, 0], points[:, 1], degree)
    return tuple(float(c) for c in coeffs)
