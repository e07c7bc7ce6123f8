"""Notices workers that promise KV events but stopped sending them (docs/architecture.md#contracts: never silently load-only).

A worker that registered with ``kv_events`` and keeps getting requests with full blocks must keep publishing
``BlockStored`` events. When ``min_requests`` such requests went to it and no event came for ``stale_s``, it
is reported once (log + metric) until its events resume.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class _Watch:
    last_event_s: float
    num_routed: int = 0
    reported: bool = False


class EventWatch:
    def __init__(self, stale_s: float = 30.0, min_requests: int = 8) -> None:
        self.stale_s = stale_s
        self.min_requests = min_requests
        self._watch: dict[str, _Watch] = {}

    def registered(self, worker_id: str, now_s: float) -> None:
        self._watch[worker_id] = _Watch(last_event_s=now_s)

    def forget(self, worker_id: str) -> None:
        self._watch.pop(worker_id, None)

    def event(self, worker_id: str, now_s: float) -> None:
        watch = self._watch.get(worker_id)
        if watch is not None:
            watch.last_event_s, watch.num_routed, watch.reported = now_s, 0, False

    def routed(self, worker_id: str) -> None:
        """A request with at least one full block went to this worker: it owes us a BlockStored."""
        watch = self._watch.get(worker_id)
        if watch is not None:
            watch.num_routed += 1

    def newly_stale(self, now_s: float) -> list[str]:
        """Workers that just went silent (each reported once per silence)."""
        out = []
        for worker_id, w in self._watch.items():
            if not w.reported and w.num_routed >= self.min_requests and now_s - w.last_event_s > self.stale_s:
                w.reported = True
                out.append(worker_id)
        return out
