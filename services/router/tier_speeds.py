"""Tier speeds learned from the workers' tier loads (``TierLoadSample`` on heartbeats): per tier (host, disk),
bytes/s and a fixed latency per load, fitted to the last ``window`` loads; the configured ``TierConfig`` (or a
profile's figures) until a tier has samples to fit.

One fit per tier for the whole cluster, not per node: loads are sparse (one per tier hit), a per-node learner
would leave most nodes on the seed for long, and a deployment's kvtiers run on alike machines. The fit:
``seconds = latency_s + num_bytes / bytes_per_s`` by least squares when the loads' sizes spread enough to tell
the two apart (largest >= 2x smallest) and the fit is physical (latency >= 0, bandwidth > 0); otherwise the
median of ``num_bytes / (seconds - seed latency)`` (at most half the seconds taken off) over loads of at least ``min_bytes`` (a tiny load measures
its latency, not the tier's bandwidth), latency kept at the seed. Pure functions plus one small holder.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from common.kvtier.sources import Link
from common.protocol import TierLoadSample
from services.router.tier_credit import TierConfig

WINDOW = 32  # loads per tier the fit looks at (as many as the link learner in topology.py)
MIN_BYTES = 1 << 20  # loads smaller than this teach latency, not bandwidth (1 MiB: ~0.3 ms at 3 GB/s)
MIN_SECONDS = 1e-6  # a load timed faster than this is a clock artefact


@dataclass(frozen=True, slots=True)
class Fit:
    link: Link
    num_samples: int  # loads the fit used; 0: the seed
    how: str  # "seed", "median" or "lstsq"


def fit_link(samples: Sequence[tuple[int, float]], seed: Link, min_bytes: int = MIN_BYTES) -> Fit:
    """Bytes/s and latency of a tier from its loads' ``(num_bytes, seconds)``; ``seed`` when none is usable."""
    usable = [(b, s) for b, s in samples if b > 0 and s >= MIN_SECONDS]
    if len(usable) >= 3 and max(b for b, _ in usable) >= 2 * min(b for b, _ in usable):
        fitted = _lstsq(usable)
        if fitted is not None:
            return Fit(fitted, len(usable), "lstsq")
    big = [(b, s) for b, s in usable if b >= min_bytes]
    if not big:
        return Fit(seed, 0, "seed")
    # At most half a load's seconds are the seed's latency: a load timed faster than that latency (a seed too
    # high for this deployment) must not read as an unbounded bandwidth.
    rates = [b / max(s - seed.latency_s, s / 2) for b, s in big]
    return Fit(Link(statistics.median(rates), seed.latency_s), len(big), "median")


def _lstsq(samples: Sequence[tuple[int, float]]) -> Link | None:
    """``seconds = a + num_bytes * k`` by ordinary least squares: Link(1/k, a), or None where not physical."""
    n = len(samples)
    mean_b = sum(b for b, _ in samples) / n
    mean_s = sum(s for _, s in samples) / n
    var_b = sum((b - mean_b) ** 2 for b, _ in samples)
    if var_b <= 0:
        return None
    k = sum((b - mean_b) * (s - mean_s) for b, s in samples) / var_b  # seconds per byte
    a = mean_s - k * mean_b
    if k <= 0 or a < 0:
        return None
    return Link(1.0 / k, a)


class TierSpeeds:
    """The last ``window`` loads per tier and the ``TierConfig`` fitted to them (the seed where none fit)."""

    def __init__(self, seed: TierConfig, window: int = WINDOW, min_bytes: int = MIN_BYTES) -> None:
        self.seed = seed
        self._min_bytes = min_bytes
        self._loads: dict[str, deque[tuple[int, float]]] = {"host": deque(maxlen=window),
                                                            "disk": deque(maxlen=window)}
        self.host = Fit(seed.host, 0, "seed")
        self.disk = Fit(seed.disk, 0, "seed")
        self.config = seed

    def record(self, samples: Sequence[TierLoadSample]) -> bool:
        """Add a heartbeat's loads; refit the tiers they touched. True when any tier's fit changed."""
        touched = set()
        for s in samples:
            if s.tier in self._loads:  # "device" loads are not a tier fetch
                self._loads[s.tier].append((s.num_bytes, s.seconds))
                touched.add(s.tier)
        if not touched:
            return False
        if "host" in touched:
            self.host = fit_link(self._loads["host"], self.seed.host, self._min_bytes)
        if "disk" in touched:
            self.disk = fit_link(self._loads["disk"], self.seed.disk, self._min_bytes)
        config = TierConfig(host_bytes_per_s=self.host.link.bytes_per_s, disk_bytes_per_s=self.disk.link.bytes_per_s,
                            host_latency_s=self.host.link.latency_s, disk_latency_s=self.disk.link.latency_s)
        changed, self.config = config != self.config, config
        return changed
