"""Publishes an engine's prefix-cache changes to the router as numbered ``KvEvents`` batches (docs/architecture.md#contracts).

Events go out on a PUB socket connected to every router's SUB. PUB/SUB may drop under pressure; the batch
numbers let a router notice and ask for a snapshot, which this class answers from the engine's cache.
"""

from __future__ import annotations

import asyncio
import os
from typing import Protocol

import structlog
from common import protocol
from common.protocol import AllCleared, BlockRemoved, BlockStored, KvEvent, KvEvents, KvSnapshot, StoredBlock
from common.router_link import EventsSocket
from services.worker.engine import BlocksRemoved, BlocksStored

log = structlog.get_logger(__name__)


class EventSource(Protocol):
    def drain_kv_events(self) -> list: ...

    def kv_snapshot(self) -> tuple[int, ...]: ...


def to_wire(event: object) -> KvEvent:
    match event:
        case BlocksStored(block_hashes=hashes, parent_hash=parent):
            return BlockStored(block_hashes=hashes, parent_hash=parent, tier="device")
        case BlocksRemoved(block_hashes=hashes):
            return BlockRemoved(block_hashes=hashes, tier="device")
        case BlockStored() | BlockRemoved() | AllCleared():
            return event  # engines that already speak the wire contract
        case _:
            raise TypeError(f"unknown KV event {type(event).__name__}")


class KvEventPublisher:
    """Numbers an engine's events within an epoch (random per publisher, i.e. per worker process) and publishes
    them to every router the events socket is connected to. Routers learn what was cached before they
    listened from a snapshot they ask for on registration, so (re)connecting never renumbers."""

    def __init__(self, worker_id: str, source: EventSource, interval_s: float = 0.01) -> None:
        self.worker_id = worker_id
        self.epoch = int.from_bytes(os.urandom(6), "little")
        self._source = source
        self._interval_s = interval_s
        self._next_event_id = 0
        self._sock: EventsSocket | None = None

    def attach(self, sock: EventsSocket) -> None:
        self._sock = sock

    def snapshot(self, request_id: str) -> KvSnapshot:
        """The engine's whole cache, tagged with the last batch it reflects."""
        self.flush()
        blocks = tuple(StoredBlock(block_hash=h, parent_hash=None, tier="device") for h in self._source.kv_snapshot())
        return KvSnapshot(request_id=request_id, worker_id=self.worker_id, event_id=self._next_event_id - 1,
                          tier_blocks=blocks, epoch=self.epoch)

    def flush(self) -> None:
        events = self._source.drain_kv_events()
        if events:
            self._publish(tuple(to_wire(e) for e in events))

    def _publish(self, events: tuple[KvEvent, ...]) -> None:
        # Numbered even with no router connected yet: routers start from a snapshot tagged with this numbering.
        msg = KvEvents(worker_id=self.worker_id, event_id=self._next_event_id, events=events, epoch=self.epoch)
        self._next_event_id += 1
        if self._sock is not None and self._sock.connected and not self._sock.send(protocol.encode(msg)):
            log.warning("kv_events_dropped", worker_id=self.worker_id, event_id=msg.event_id)

    async def run(self) -> None:
        """Publish ``interval_s`` after the engine says events are pending (its ``kv_events_pending``), one
        batch for what a step made; an engine without that signal is polled every ``interval_s``. A 10 ms poll
        cost an idle worker (on its engine's core) most of its 8-9 ms of CPU a second (bench/results/token_cpu.json)."""
        pending: asyncio.Event | None = getattr(self._source, "kv_events_pending", None)
        while True:
            self.flush()
            if pending is not None:
                await pending.wait()
            await asyncio.sleep(self._interval_s)
            if pending is not None:
                pending.clear()  # before the flush: what comes after it sets it again
