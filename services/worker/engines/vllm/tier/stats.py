"""The kvtier connector's loads as vLLM ``KVConnectorStats``: how they get from the engine core process (where
the connector runs) to the worker process, over the channel vLLM already has for NIXL's telemetry.

The worker-side connector appends one ``[tier, num_bytes, seconds]`` per finished load; vLLM collects
``get_kv_connector_stats()`` after each model step, aggregates it across workers and the scheduler, sends its
``to_dict()`` with the SchedulerStats, and our stat logger (services/worker/engines/vllm/stats.py) turns each
entry into a ``TierLoadSample``. Under a MultiConnector (kvtier beside NIXL) the dict arrives nested under the
connector's class name. vLLM's own stat loggers (which would rebuild the class by a registered name) are off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

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
