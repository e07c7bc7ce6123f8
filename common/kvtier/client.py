"""The worker's client of kvtier, behind the ``TierBackend`` protocol the mock engine calls.

Best effort by construction: ``offload`` never blocks (blocks queue, a background task sends them, the
queue is bounded and drops its oldest entries), and ``lookup`` returns ``[]`` on any failure or after
``lookup_timeout_s``, so a kvtier that is down or slow costs a recompute, never an error. After a failure
the client backs off (no lookups, offloads dropped) for ``backoff_s`` and reconnects with a fresh socket, so
a dead kvtier neither adds latency to every request nor makes ZeroMQ queue gigabytes for it.

Every block coming back is checked here: its size and xxh3_64 checksum must match what kvtier says it
stored; the first bad block ends the run (the rest is recomputed).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog
import zmq
import zmq.asyncio

from common.errors import RemoteError, TransportTimeout
from common.protocol import TierBlocks, TierLookup, TierStore, TierStored
from common.security import CurveKeys
from common.transport import Client, TransportConfig, new_id
from common.kvtier.transfer import InlineTransfer, block_ok

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class FetchedBlock:
    block_hash: int
    data: bytes
    tier: str


class TierBackend(Protocol):
    """What an engine needs from a KV tier."""

    def offload(self, block_hashes: Sequence[int], make_payload: Callable[[int], bytes]) -> None:
        """Queue blocks for storing (``make_payload(hash)`` gives the bytes, called later); never blocks."""

    async def lookup(self, block_hashes: Sequence[int]) -> list[FetchedBlock]:
        """The verified leading run of ``block_hashes`` the tier holds; [] when it holds none or fails."""

    async def close(self) -> None: ...


@dataclass(frozen=True)
class TierClientConfig:
    endpoint: str
    worker_id: str = "worker"
    # The model this worker's blocks are KV of (its hash seed): sent with every store and lookup, kvtier keeps
    # blocks per model.
    model_id: int = 0
    lookup_timeout_s: float = 0.5
    store_timeout_s: float = 2.0
    # After a failure: no traffic for this long, then a fresh socket.
    backoff_s: float = 1.0
    # Blocks waiting to be offloaded; the oldest are dropped beyond this.
    max_pending_blocks: int = 256
    # Block bytes per TierStore message (and per lookup reply, via max_blocks).
    max_message_bytes: int = 12 * 1024 * 1024
    # Messages ZeroMQ may queue toward kvtier; small, so a dead kvtier cannot pile up memory.
    hwm: int = 8
    # This worker's CURVE keys (common/security.py); None: plain TCP.
    curve: CurveKeys | None = None


def next_page(block_hashes: Sequence[int], num_done: int, deadline: float, what: str) -> tuple[tuple[int, ...], float]:
    """A paged lookup's next request: the hashes not yet answered and the seconds left before ``deadline``
    (``time.monotonic()``); ``TransportTimeout`` once it has passed."""
    remaining_s = deadline - time.monotonic()
    if remaining_s <= 0:
        raise TransportTimeout(f"{what} deadline")
    return tuple(block_hashes[num_done:]), remaining_s


class TierClient:
    def __init__(self, config: TierClientConfig) -> None:
        self.config = config
        self._ctx: zmq.asyncio.Context | None = None
        self._client: Client | None = None
        self._pending: deque[tuple[int, Callable[[int], bytes]]] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._down_until = 0.0
        self._closed = False
        self._ids = itertools.count()
        self.block_bytes_hint = 0  # learned from the first payload, to size lookup replies
        # Counters (for logs and tests).
        self.num_offloaded = 0
        self.num_dropped = 0
        self.num_lookups = 0
        self.num_hits = 0
        self.num_failures = 0
        self.num_bad_blocks = 0

    # ------------------------------------------------------------------------------------------ backend

    def offload(self, block_hashes: Sequence[int], make_payload: Callable[[int], bytes]) -> None:
        if self._closed or not block_hashes:
            return
        if self._is_down():
            self.num_dropped += len(block_hashes)
            return
        for block_hash in block_hashes:
            self._pending.append((block_hash, make_payload))
        while len(self._pending) > self.config.max_pending_blocks:
            self._pending.popleft()
            self.num_dropped += 1
        self._ensure_task()
        self._wake.set()

    async def lookup(self, block_hashes: Sequence[int]) -> list[FetchedBlock]:
        if self._closed or not block_hashes or self._is_down():
            return []
        self.num_lookups += 1
        max_blocks = (max(1, self.config.max_message_bytes // self.block_bytes_hint)
                      if self.block_bytes_hint else 0)
        out: list[FetchedBlock] = []
        deadline = time.monotonic() + self.config.lookup_timeout_s
        try:
            while len(out) < len(block_hashes):
                rest, remaining_s = next_page(block_hashes, len(out), deadline, "lookup")
                reply = await self._request(TierLookup(request_id=new_id("tl"), block_hashes=rest,
                                                       max_blocks=max_blocks, model_id=self.config.model_id), remaining_s)
                assert isinstance(reply, TierBlocks)
                good = self._verified(rest, reply)
                out += good
                if len(good) < len(reply.blocks) or not reply.truncated:
                    break  # a bad block, or the tier's run ended
        except (TransportTimeout, RemoteError, zmq.ZMQError, AssertionError) as exc:
            self._failed("lookup", exc)
            # Blocks already verified are still good: use them.
        except Exception as exc:  # a lookup is an optimisation: whatever breaks in it costs a recompute, not the request
            log.exception("kvtier_lookup_failed")
            self._failed("lookup", exc)
        self.num_hits += len(out)
        return out

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        await self._reset()
        if self._ctx is not None:
            # destroy, not term: a socket a failed lookup's reset task has not closed yet must not hang us.
            self._ctx.destroy(linger=0)
            self._ctx = None

    # ---------------------------------------------------------------------------------------- internals

    def _verified(self, asked: Sequence[int], reply: TierBlocks) -> list[FetchedBlock]:
        good: list[FetchedBlock] = []
        for expected_hash, block in zip(asked, reply.blocks):
            if not block_ok(block, expected_hash):
                self.num_bad_blocks += 1
                log.warning("tier_block_rejected", block_hash=block.block_hash, reason="hash/size/checksum")
                break
            good.append(FetchedBlock(block.block_hash, block.data, block.tier))
        return good

    def _is_down(self) -> bool:
        return time.monotonic() < self._down_until

    def _failed(self, what: str, exc: BaseException) -> None:
        self.num_failures += 1
        if not self._is_down():
            log.warning("kvtier_unavailable", what=what, error=repr(exc), backoff_s=self.config.backoff_s)
        self._down_until = time.monotonic() + self.config.backoff_s
        self.num_dropped += len(self._pending)
        self._pending.clear()
        # A fresh socket next time: drops whatever ZeroMQ still queues for the dead peer.
        asyncio.get_running_loop().create_task(self._reset())

    async def _reset(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def _request(self, msg, timeout_s: float):
        if self._client is None:
            if self._ctx is None:
                self._ctx = zmq.asyncio.Context()
            transport = TransportConfig(hwm=self.config.hwm, curve=self.config.curve).toward("kvtier")
            self._client = Client(self._ctx, self.config.endpoint, transport)
        # The outer wait_for also bounds a send blocked on a full queue. It raises the builtin TimeoutError (also
        # when both deadlines expire in one turn of a busy loop): named like the inner timeout, so every caller's
        # "kvtier failed -> recompute" path sees it.
        try:
            return await asyncio.wait_for(self._client.request(msg, timeout_s), timeout_s + 0.05)
        except TimeoutError as exc:
            raise TransportTimeout(f"kvtier gave no reply to {type(msg).__name__} in {timeout_s} s") from exc
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # our caller cancelled us: pass it on
            # Another lookup's failure closed the socket this one was sending on: a failure, not a cancel.
            raise TransportTimeout(f"kvtier socket reset during {type(msg).__name__}") from exc

    def _ensure_task(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._offload_loop(), name="kvtier-offload")

    async def _offload_loop(self) -> None:
        while True:
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch: list[tuple[int, bytes]] = []
            num_bytes = 0
            while self._pending and (not batch or num_bytes < self.config.max_message_bytes):
                block_hash, make_payload = self._pending.popleft()
                data = make_payload(block_hash)
                self.block_bytes_hint = self.block_bytes_hint or len(data)
                batch.append((block_hash, data))
                num_bytes += len(data)
                if num_bytes + len(data) > self.config.max_message_bytes:
                    break
            msg = TierStore(request_id=new_id("ts"), worker_id=self.config.worker_id,
                            blocks=InlineTransfer.pack(batch), model_id=self.config.model_id)
            try:
                reply = await self._request(msg, self.config.store_timeout_s)
                if isinstance(reply, TierStored):
                    self.num_offloaded += reply.num_stored + reply.num_present
                    self.num_dropped += reply.num_rejected
            except (TransportTimeout, RemoteError, zmq.ZMQError) as exc:
                self.num_dropped += len(batch)
                self._failed("store", exc)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # never let the offload task die
                log.exception("kvtier_offload_failed")
                self._failed("store", exc)
            await asyncio.sleep(0)

