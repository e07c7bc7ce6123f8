"""Publishes an engine's prefix-cache changes to the router as numbered ``KvEvents`` batches (docs/architecture.md#contracts).

Events go out on a PUB socket connected to the router's SUB. PUB/SUB may drop under pressure; the batch
numbers let the router notice and ask for a snapshot, which this class answers from the engine's cache.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

import structlog
import zmq
import zmq.asyncio

from common import protocol
from common.protocol import AllCleared, BlockRemoved, BlockStored, KvEvent, KvEvents, KvSnapshot, StoredBlock
from common.security import secure_client
from common.transport import TransportConfig
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
    def __init__(self, worker_id: str, source: EventSource, interval_s: float = 0.01) -> None:
        self.worker_id = worker_id
        self._source = source
        self._interval_s = interval_s
        self._next_event_id = 0
        self._sock: zmq.asyncio.Socket | None = None

    def connect(self, ctx: zmq.asyncio.Context, endpoint: str, config: TransportConfig) -> None:
        """(Re)connect to a router's SUB endpoint. Numbering restarts at 0: the router starts this worker
        over, as after a re-registration."""
        self.close()
        sock = ctx.socket(zmq.PUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, config.hwm)
        secure_client(sock, config.curve)
        sock.connect(endpoint)
        self._sock = sock
        self._next_event_id = 0
        # Everything cached before this connection reaches the router as the first batch.
        cached = self._source.kv_snapshot()
        self._source.drain_kv_events()
        if cached:
            self._publish((BlockStored(block_hashes=cached, parent_hash=None, tier="device"),))

    def snapshot(self, request_id: str) -> KvSnapshot:
        """The engine's whole cache, tagged with the last batch it reflects."""
        self.flush()
        blocks = tuple(StoredBlock(block_hash=h, parent_hash=None, tier="device") for h in self._source.kv_snapshot())
        return KvSnapshot(request_id=request_id, worker_id=self.worker_id, event_id=self._next_event_id - 1,
                          tier_blocks=blocks)

    def flush(self) -> None:
        if self._sock is None:
            return
        events = self._source.drain_kv_events()
        if events:
            self._publish(tuple(to_wire(e) for e in events))

    def _publish(self, events: tuple[KvEvent, ...]) -> None:
        assert self._sock is not None
        msg = KvEvents(worker_id=self.worker_id, event_id=self._next_event_id, events=events)
        self._next_event_id += 1
        try:
            self._sock.send(protocol.encode(msg), flags=zmq.NOBLOCK)
        except zmq.Again:
            log.warning("kv_events_dropped", worker_id=self.worker_id, event_id=msg.event_id)

    async def run(self) -> None:
        while True:
            self.flush()
            await asyncio.sleep(self._interval_s)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
