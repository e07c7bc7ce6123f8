"""The router's tier-speed learner: fits bytes/s and latency to tier loads, the seed until it can."""

from __future__ import annotations

import pytest

from common.kvtier.sources import Link
from common.protocol import TierLoadSample
from services.router.tier_credit import TierConfig
from services.router.tier_speeds import Fit, TierSpeeds, fit_link

SEED = Link(2.9e9, 0.001)
MB = 1 << 20


def _timed(sizes: list[int], bytes_per_s: float, latency_s: float) -> list[tuple[int, float]]:
    return [(b, latency_s + b / bytes_per_s) for b in sizes]


@pytest.mark.parametrize(
    ("samples", "want_bytes_per_s", "want_latency_s", "want_how"),
    [
        # Nothing, or nothing usable (zero bytes, a zero time): the seed.
        ([], SEED.bytes_per_s, SEED.latency_s, "seed"),
        ([(0, 0.01), (4 * MB, 0.0)], SEED.bytes_per_s, SEED.latency_s, "seed"),
        # Only tiny loads of one size: they time the latency, not the bandwidth; the seed stays.
        (_timed([4096] * 5, 1e9, 0.002), SEED.bytes_per_s, SEED.latency_s, "seed"),
        # Sizes spread 4x: latency and bandwidth both fitted exactly.
        (_timed([MB, 2 * MB, 4 * MB, 3 * MB], 5e8, 0.003), 5e8, 0.003, "lstsq"),
        # Spread but with a fit that is not physical (bigger loads faster): medians of the big ones.
        ([(MB, 0.010), (4 * MB, 0.002), (2 * MB, 0.003)], None, SEED.latency_s, "median"),
        # One size only (no spread): the median of bytes / (seconds - seed latency), the latency the seed's.
        ([(8 * MB, 0.001 + 8 * MB / 2e9)] * 2 + [(8 * MB, 0.001 + 8 * MB / 1e9)], 2e9, SEED.latency_s, "median"),
        # Fewer than 3 loads: no least squares even when spread.
        (_timed([4 * MB, 8 * MB], 1e9, 0.001), 1e9, SEED.latency_s, "median"),
        # Timed faster than the seed's latency: at most half a load's seconds are taken as latency.
        ([(4 * MB, 0.0008)] * 3, 4 * MB / 0.0004, SEED.latency_s, "median"),
    ],
)
def test_fit_link(samples, want_bytes_per_s, want_latency_s, want_how) -> None:
    fit = fit_link(samples, SEED)
    assert fit.how == want_how
    assert fit.link.latency_s == pytest.approx(want_latency_s, rel=1e-6)
    if want_bytes_per_s is not None:
        assert fit.link.bytes_per_s == pytest.approx(want_bytes_per_s, rel=1e-6)
    if want_how == "seed":
        assert fit.num_samples == 0


def test_median_ignores_outliers() -> None:
    """One slow load among many (a stalled kvtier) does not drag the bandwidth down."""
    samples = [(8 * MB, 0.001 + 8 * MB / 3e9)] * 6 + [(8 * MB, 2.0)]
    assert fit_link(samples, SEED).link.bytes_per_s == pytest.approx(3e9, rel=1e-6)


def test_speeds_seed_then_learn_per_tier() -> None:
    seed = TierConfig()
    speeds = TierSpeeds(seed, window=4)
    assert speeds.config == seed and speeds.host == Fit(seed.host, 0, "seed")
    assert not speeds.record([TierLoadSample(seq=1, tier="device", num_bytes=8 * MB, seconds=0.01)])
    assert speeds.record([TierLoadSample(seq=i, tier="disk", num_bytes=b, seconds=0.002 + b / 4e8)
                          for i, b in enumerate([MB, 2 * MB, 4 * MB], 1)])
    assert speeds.config.disk_bytes_per_s == pytest.approx(4e8) and speeds.config.disk_latency_s == pytest.approx(0.002)
    assert speeds.config.host == seed.host  # untouched tier keeps its seed
    # The window forgets: four fast host loads later, the old slow ones no longer count.
    speeds.record([TierLoadSample(seq=1, tier="host", num_bytes=8 * MB, seconds=8 * MB / 1e8 + 0.001)] * 4)
    speeds.record([TierLoadSample(seq=1, tier="host", num_bytes=8 * MB, seconds=8 * MB / 5e9 + 0.001)] * 4)
    assert speeds.config.host_bytes_per_s == pytest.approx(5e9)
    assert not speeds.record([TierLoadSample(seq=1, tier="host", num_bytes=8 * MB, seconds=8 * MB / 5e9 + 0.001)])
