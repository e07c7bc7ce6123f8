"""The kvtier connector's loads as vLLM ``KVConnectorStats``: how they get from the engine core process (where
the connector runs) to the worker process, over the channel vLLM already has for NIXL's telemetry.

The worker-side connector appends one ``[tier, num_bytes, seconds]`` per finished load; vLLM collects
``get_kv_connector_stats()`` after each model step, aggregates it across workers and the scheduler, sends its
``to_dict()`` with the SchedulerStats, and our stat logger (services/worker/engines/vllm/stats.py) turns each
entry into a ``TierLoadSample``. Under a MultiConnector (kvtier beside NIXL) the dict arrives nested under the
connector's class name.

vLLM's own stat loggers run beside ours and are always on (AsyncLLM adds a PrometheusStatLogger whatever loggers it
is given, and a LoggingStatLogger at INFO): under a MultiConnector the Prometheus one asserts that every child that
reports stats built Prometheus metrics, and the logging one rebuilds each child's stats by its registered name. So
the connector registers its name with vLLM's factory and builds ``TierPromMetrics``: a tier hit must never be the
engine's death (it was, once NIXL sat beside the tier: ``SplitserveTierConnector is not contained in the list of
registered connectors with Prometheus metrics support``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats

LOADS_KEY = "kvtier_loads"  # list of [tier, num_bytes, seconds], oldest first


@dataclass
class TierLoadStats(KVConnectorStats):
    def __post_init__(self) -> None:
        self.data.setdefault(LOADS_KEY, [])

    def record(self, tier: str, num_bytes: int, seconds: float) -> None:
        self.data[LOADS_KEY].append([tier, int(num_bytes), float(seconds)])

    def reset(self) -> None:
        self.data = {LOADS_KEY: []}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        self.data[LOADS_KEY].extend(other.data.get(LOADS_KEY, []))
        return self

    def reduce(self) -> dict[str, Any]:
        loads = self.data[LOADS_KEY]
        num_bytes = sum(b for _, b, _ in loads)
        seconds = sum(s for _, _, s in loads)
        return {"num_loads": len(loads), "num_bytes": num_bytes,
                "bytes_per_s": num_bytes / seconds if seconds > 0 else 0.0}

    def is_empty(self) -> bool:
        return not self.data[LOADS_KEY]

    def take(self) -> TierLoadStats | None:
        """The loads since the last call (None: none), this one emptied: each load is sent once."""
        if self.is_empty():
            return None
        taken = TierLoadStats(data={LOADS_KEY: self.data[LOADS_KEY]})
        self.reset()
        return taken


class TierPromMetrics(KVConnectorPromMetrics):
    """The tier's loads on vLLM's Prometheus registry (``vllm:`` names, so vLLM's own re-registration clears them)."""

    def __init__(self, vllm_config: Any, metric_types: dict, labelnames: list[str],
                 per_engine_labelvalues: dict[int, list[object]]) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        loads = self._counter_cls(name="vllm:splitserve_kvtier_loads",
                                  documentation="KV loads from the splitserve kvtier (host or disk).",
                                  labelnames=[*labelnames, "tier"])
        num_bytes = self._counter_cls(name="vllm:splitserve_kvtier_load_bytes",
                                      documentation="Bytes of KV loaded from the splitserve kvtier.",
                                      labelnames=[*labelnames, "tier"])
        self._loads, self._bytes = loads, num_bytes

    def observe(self, transfer_stats_data: Any, engine_idx: int = 0) -> None:
        data = transfer_stats_data.data if isinstance(transfer_stats_data, KVConnectorStats) else transfer_stats_data
        labelvalues = self.per_engine_labelvalues.get(engine_idx, [])
        # Stats come from the engine core: a malformed entry is skipped, never raised into vLLM's output loop.
        for entry in (data or {}).get(LOADS_KEY, ()):
            try:
                tier, num_bytes, _seconds = entry
                num_bytes = max(int(num_bytes), 0)
            except (TypeError, ValueError):
                continue
            self._loads.labels(*labelvalues, str(tier)).inc()
            self._bytes.labels(*labelvalues, str(tier)).inc(num_bytes)
