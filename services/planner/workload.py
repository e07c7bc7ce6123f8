"""What a plan is asked for: the workload (ISL/OSL samples, rate or concurrency), the SLOs, the engine limits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


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
