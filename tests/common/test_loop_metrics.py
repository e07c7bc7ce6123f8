"""The loop's histograms and counters expose what prometheus_client's own would, sample for sample."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from common.loop_metrics import LoopCounter, LoopHistogram

BUCKETS = (0.001, 0.01, 0.1, 1.0, 30.0)


def _samples(registry: CollectorRegistry) -> list[str]:
    return sorted(line for line in generate_latest(registry).decode().splitlines() if "_created" not in line)


@pytest.mark.parametrize("values", [
    [],
    [0.001, 0.01, 0.1, 1.0, 30.0],  # on each bound: counted in that bucket (le is inclusive)
    [0.0, 0.0005, 0.02, 0.02, 5.0, 31.0, 1e9],  # inside buckets, over the last one (+Inf)
])
def test_histogram_samples_match_prometheus_client(values) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    hist = LoopHistogram("x_seconds", "latency", BUCKETS, ours)
    reference = Histogram("x_seconds", "latency", buckets=BUCKETS, registry=theirs)
    for v in values:
        hist.observe(v)
        reference.observe(v)
    assert _samples(ours) == _samples(theirs)
    assert ours.get_sample_value("x_seconds_count") == len(values)


def test_counter_samples_match_prometheus_client() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    counter = LoopCounter("x_tokens", "tokens", ours)
    reference = Counter("x_tokens", "tokens", registry=theirs)
    for amount in (1, 5, 0):
        counter.inc(amount)
        reference.inc(amount)
    assert _samples(ours) == _samples(theirs)
    assert ours.get_sample_value("x_tokens_total") == 6
    with pytest.raises(ValueError):
        counter.inc(-1)
