"""Worker metrics (``splitserve_worker_*``): queue depths, KV usage, prefix hits and KV transfers."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from common.protocol import WorkerLoad
from services.worker.engine import EngineCounters

_TRANSFER_BUCKETS_S = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 5.0)


class WorkerMetrics:
    def __init__(self, worker_id: str, role: str) -> None:
        r = self.registry = CollectorRegistry()
        labels = {"worker_id": worker_id, "role": role}
        self._running = Gauge("splitserve_worker_running", "Requests running in the engine", list(labels),
                              registry=r).labels(**labels)
        self._waiting = Gauge("splitserve_worker_waiting", "Requests queued in the engine", list(labels),
                              registry=r).labels(**labels)
        self._kv_used = Gauge("splitserve_worker_kv_used_blocks", "KV blocks in use", list(labels),
                              registry=r).labels(**labels)
        self._kv_total = Gauge("splitserve_worker_kv_total_blocks", "KV blocks in the engine", list(labels),
                               registry=r).labels(**labels)
        self._transfers = Counter("splitserve_worker_kv_transfers", "KV pulls finished", list(labels),
                                  registry=r).labels(**labels)
        self._transfer_failures = Counter("splitserve_worker_kv_transfer_failures", "KV pulls that failed",
                                          list(labels), registry=r).labels(**labels)
        self._transfer_bytes = Counter("splitserve_worker_kv_transfer_bytes", "KV bytes pulled", list(labels),
                                       registry=r).labels(**labels)
        self._transfer_seconds = Histogram("splitserve_worker_kv_transfer_seconds", "Seconds per KV pull",
                                           list(labels), buckets=_TRANSFER_BUCKETS_S, registry=r).labels(**labels)
        self._prefix_hits = Counter("splitserve_worker_prefix_hits", "Prefix-cache hits (engine's unit)",
                                    list(labels), registry=r).labels(**labels)
        self._last = EngineCounters()

    def observe(self, load: WorkerLoad, counters: EngineCounters) -> None:
        """Called every heartbeat: gauges from the load, counters advanced by the engine's cumulative deltas."""
        self._running.set(load.num_running)
        self._waiting.set(load.num_waiting)
        self._kv_used.set(load.num_total_blocks - load.num_free_blocks)
        self._kv_total.set(load.num_total_blocks)
        last = self._last
        self._transfers.inc(max(0, counters.num_transfers - last.num_transfers))
        self._transfer_failures.inc(max(0, counters.num_transfer_failures - last.num_transfer_failures))
        self._transfer_bytes.inc(max(0, counters.num_transfer_bytes - last.num_transfer_bytes))
        self._prefix_hits.inc(max(0, counters.num_prefix_hits - last.num_prefix_hits))
        for seconds in counters.transfer_seconds:  # drained by the engine on each counters() call
            self._transfer_seconds.observe(seconds)
        self._last = counters

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        start_http_server(port, addr=host, registry=self.registry)
