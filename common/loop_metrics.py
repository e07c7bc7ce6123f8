"""Prometheus histograms and counters for one event loop's hot path.

prometheus_client's ``Histogram.observe`` takes a lock per bucket and per sum and walks the buckets in a Python
loop; ``Counter.inc`` takes a lock: ~1-3 us each, and the frontend makes 10-15 of them a request (TTFT, ITL per
output, E2E, the arrival mix, token counters). These keep plain numbers, written only by the event loop's thread
(no lock: CPython's GIL makes each write whole, and a scrape from the metrics server's thread reads a copy), and
expose the same samples (``_bucket`` cumulative with ``le``, ``_count``, ``_sum``; a counter's ``_total``) through
the registry, so the planner, dashboards and ``registry.get_sample_value`` read them as before. What they leave
out: labels, exemplars, ``_created``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString


class LoopHistogram:
    def __init__(self, name: str, documentation: str, buckets: Sequence[float], registry: CollectorRegistry) -> None:
        self._name, self._documentation = name, documentation
        self._bounds = tuple(float(b) for b in buckets)  # upper bounds, inclusive (Prometheus' le), ascending
        self._le = [floatToGoString(b) for b in self._bounds] + ["+Inf"]
        self._counts = [0] * (len(self._bounds) + 1)  # per bucket, not cumulative; the last is +Inf
        self._sum = 0.0
        registry.register(self)

    def observe(self, value: float) -> None:
        self._counts[bisect_left(self._bounds, value)] += 1
        self._sum += value

    def collect(self) -> Iterator[Metric]:
        counts, total = list(self._counts), self._sum
        cumulative, buckets = 0, []
        for le, count in zip(self._le, counts):
            cumulative += count
            buckets.append((le, float(cumulative)))
        family = HistogramMetricFamily(self._name, self._documentation)
        family.add_metric([], buckets, total)
        yield family

    def describe(self) -> list[Metric]:
        return [HistogramMetricFamily(self._name, self._documentation)]


class LoopCounter:
    def __init__(self, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self._name, self._documentation = name, documentation
        self._value = 0.0
        registry.register(self)

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        self._value += amount

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self._name, self._documentation, value=self._value)

    def describe(self) -> list[Metric]:
        return [CounterMetricFamily(self._name, self._documentation)]
