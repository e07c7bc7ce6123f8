"""Worker metrics (``splitserve_worker_*``): queue depths, KV usage, prefix hits and KV transfers."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from common.protocol import WorkerLoad
from services.worker.engine import EngineCounters

_TRANSFER_BUCKETS_S = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 5.0)


class WorkerMetrics:
    def __init__(self, worker_id: str, role: str, simulated_transfers: bool = False) -> None:
        r = self.registry = CollectorRegistry()
        names = ["worker_id", "role"]
        # An engine that only simulates its KV moves (mock) counts them under splitserve_worker_simulated_kv_*:
        # a dashboard summing wire bytes (splitserve_worker_kv_transfer_bytes) never adds made-up ones.
        kv = "splitserve_worker_simulated_kv" if simulated_transfers else "splitserve_worker_kv"
        sim = "Simulated (no wire): " if simulated_transfers else ""
        self._families = {
            "running": Gauge("splitserve_worker_running", "Requests running in the engine", names, registry=r),
            "waiting": Gauge("splitserve_worker_waiting", "Requests queued in the engine", names, registry=r),
            "kv_used": Gauge("splitserve_worker_kv_used_blocks", "KV blocks in use", names, registry=r),
            "kv_total": Gauge("splitserve_worker_kv_total_blocks", "KV blocks in the engine", names, registry=r),
            "transfers": Counter(f"{kv}_transfers", f"{sim}KV pulls finished", names, registry=r),
            "transfer_failures": Counter("splitserve_worker_kv_transfer_failures", "KV pulls that failed", names,
                                         registry=r),
            "transfer_bytes": Counter(f"{kv}_transfer_bytes", f"{sim}KV bytes pulled", names, registry=r),
            "transfer_seconds": Histogram(f"{kv}_transfer_seconds", f"{sim}Seconds per KV pull", names,
                                          buckets=_TRANSFER_BUCKETS_S, registry=r),
            "prefix_hits": Counter("splitserve_worker_prefix_hits", "Prefix-cache hits (engine's unit)", names,
                                   registry=r),
        }
        # By kind (prefill: the prompt only, for a decode worker elsewhere; generate: a whole request) and outcome
        # (finished, failed, lost with the engine, cancelled): labelled apart from the per-role gauges above.
        self._requests = Counter("splitserve_worker_requests", "Requests this worker ended, by kind and outcome",
                                 [*names, "kind", "outcome"], registry=r)
        self._prompt_tokens = Counter("splitserve_worker_prompt_tokens", "Prompt tokens of the requests it ended",
                                      [*names, "kind"], registry=r)
        self._request_labels: set[tuple[str, str]] = set()  # (kind, outcome) series made under the role now
        self._worker_id = worker_id
        self._role = ""
        self.set_role(role)
        self._last = EngineCounters()

    def set_role(self, role: str) -> None:
        """Label this worker's series with its role now (a SetRole moved it): the old role's series go, the
        counters start over under the new label (rate() per series is unaffected)."""
        if role == self._role:
            return
        if self._role:
            for family in self._families.values():
                family.remove(self._worker_id, self._role)
            for kind, outcome in self._request_labels:
                self._requests.remove(self._worker_id, self._role, kind, outcome)
            for kind in {kind for kind, _ in self._request_labels}:
                self._prompt_tokens.remove(self._worker_id, self._role, kind)
            self._request_labels.clear()
        self._role = role
        c = {name: family.labels(worker_id=self._worker_id, role=role) for name, family in self._families.items()}
        self._running, self._waiting, self._kv_used, self._kv_total = (c["running"], c["waiting"], c["kv_used"],
                                                                       c["kv_total"])
        self._transfers, self._transfer_failures = c["transfers"], c["transfer_failures"]
        self._transfer_bytes, self._transfer_seconds = c["transfer_bytes"], c["transfer_seconds"]
        self._prefix_hits = c["prefix_hits"]

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

    def request_done(self, kind: str, outcome: str, num_prompt_tokens: int) -> None:
        self._request_labels.add((kind, outcome))
        self._requests.labels(worker_id=self._worker_id, role=self._role, kind=kind, outcome=outcome).inc()
        self._prompt_tokens.labels(worker_id=self._worker_id, role=self._role, kind=kind).inc(num_prompt_tokens)

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        start_http_server(port, addr=host, registry=self.registry)
