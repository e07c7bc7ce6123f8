"""A blocking client of kvtier for code that has no event loop: vLLM's scheduler and model-runner processes.

Same contract as ``tier_client.TierClient`` (best effort, bounded): ``probe`` and ``fetch`` give up after their
timeout and answer "nothing held", ``store`` only queues (a daemon thread sends, the queue drops its oldest
blocks beyond ``max_pending_blocks``). After a failure the client backs off for ``backoff_s`` (no traffic) and
then dials a fresh socket, so late replies of a timed-out request can never be taken for a new one's.

Every fetched block is checked here: hash, size and xxh3_64 checksum must match; the first bad block ends the
run (the rest is recomputed). ZeroMQ sockets are not thread-safe: the caller's thread and the store thread
each own one; sockets are made lazily, so an instance may be built before vLLM forks.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Sequence

import structlog
import zmq

from common import protocol
from common.backoff import backoff_s
from common.errors import RemoteError, TransportTimeout
from common.protocol import (
    ErrorReply,
    GetStats,
    Message,
    TierBlock,
    TierBlocks,
    TierLookup,
    TierStats,
    TierStore,
    TierStored,
)
from common.security import secure_client
from common.transport import new_id
from common.kvtier.transfer import InlineTransfer, block_ok
from common.kvtier.client import TierClientConfig, next_page

log = structlog.get_logger(__name__)


class SyncTierClient:
    def __init__(self, config: TierClientConfig) -> None:
        self.config = config
        self._ctx: zmq.Context | None = None
        self._sock: zmq.Socket | None = None  # the caller's thread
        self._down_until = 0.0
        self._num_failed_in_row = 0
        self._pending: deque[tuple[int, bytes]] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._ids = itertools.count()
        # Counters (logs, tests).
        self.num_probes = 0
        self.num_fetched = 0
        # The slowest tier the last fetch's blocks came from ("disk" if any did), for its load's timing sample.
        self.last_fetch_tier = "host"
        self.num_bad_blocks = 0
        self.num_stored = 0
        self.num_dropped = 0
        self.num_failures = 0

    # ------------------------------------------------------------------------------------------- lookups

    def probe(self, block_hashes: Sequence[int]) -> int:
        """How many leading blocks of ``block_hashes`` kvtier holds (0 on any failure)."""
        if not block_hashes or self._is_down():
            return 0
        self.num_probes += 1
        msg = TierLookup(request_id=new_id("tp"), block_hashes=tuple(block_hashes), with_data=False,
                         model_id=self.config.model_id)
        try:
            reply = self._request_main(msg, self.config.lookup_timeout_s)
        except (TransportTimeout, RemoteError, zmq.ZMQError) as exc:
            self._failed("probe", exc)
            return 0
        if not isinstance(reply, TierBlocks):
            return 0
        n = 0
        for expected, block in zip(block_hashes, reply.blocks):
            if block.block_hash != expected:
                break
            n += 1
        return n

    def fetch(self, block_hashes: Sequence[int], block_bytes: int, timeout_s: float) -> list[bytes]:
        """The verified leading run of ``block_hashes`` (each exactly ``block_bytes``); fewer on any failure."""
        if not block_hashes or self._is_down():
            return []
        max_blocks = max(1, self.config.max_message_bytes // max(1, block_bytes))
        out: list[bytes] = []
        self.last_fetch_tier = "host"
        deadline = time.monotonic() + timeout_s
        try:
            while len(out) < len(block_hashes):
                rest, remaining_s = next_page(block_hashes, len(out), deadline, "fetch")
                reply = self._request_main(TierLookup(request_id=new_id("tf"), block_hashes=rest,
                                                      max_blocks=max_blocks, model_id=self.config.model_id), remaining_s)
                if not isinstance(reply, TierBlocks):
                    break
                good = 0
                for expected, block in zip(rest, reply.blocks):
                    if not block_ok(block, expected, block_bytes):
                        self.num_bad_blocks += 1
                        log.warning("tier_block_rejected", block_hash=block.block_hash, size=len(block.data),
                                    expected_size=block_bytes)
                        break
                    out.append(block.data)
                    if block.tier == "disk":
                        self.last_fetch_tier = "disk"
                    good += 1
                if good < len(reply.blocks) or not reply.truncated or not reply.blocks:
                    break
        except (TransportTimeout, RemoteError, zmq.ZMQError) as exc:
            self._failed("fetch", exc)  # blocks already verified stay good
        self.num_fetched += len(out)
        return out

    def lookup_slots(self, block_hashes: Sequence[int], block_bytes: int,
                     timeout_s: float) -> tuple[list[TierBlock], str, bool]:
        """One NIXL lookup: the leading run's blocks as pool slots (host blocks, or disk blocks kvtier read into
        bounce slots: checksums to verify after the READ) or inline bytes (verified here), the NIXL agent owning
        the slots, and whether kvtier stopped at a cap (READ these before asking for the rest: bounce slots get
        reused). ([], "", False) on any failure."""
        if not block_hashes or self._is_down():
            return [], "", False
        try:
            reply = self._request_main(TierLookup(request_id=new_id("tn"), block_hashes=tuple(block_hashes),
                                                  host_slots=True, model_id=self.config.model_id), timeout_s)
        except (TransportTimeout, RemoteError, zmq.ZMQError) as exc:
            self._failed("lookup", exc)
            return [], "", False
        if not isinstance(reply, TierBlocks):
            return [], "", False
        out: list[TierBlock] = []
        for expected, block in zip(block_hashes, reply.blocks):
            if not block_ok(block, expected, block_bytes, slot_ok=True):
                self.num_bad_blocks += 1
                log.warning("tier_block_rejected", block_hash=block.block_hash, size=block.size)
                break
            out.append(block)
        self.num_fetched += len(out)
        return out, reply.nixl_agent, reply.truncated and len(out) == len(reply.blocks) > 0

    def stats(self, timeout_s: float = 1.0) -> TierStats | None:
        if self._is_down():
            return None
        try:
            reply = self._request_main(GetStats(request_id=new_id("tg")), timeout_s)
        except (TransportTimeout, RemoteError, zmq.ZMQError) as exc:
            self._failed("stats", exc)
            return None
        return reply if isinstance(reply, TierStats) else None

    # -------------------------------------------------------------------------------------------- stores

    def store(self, blocks: Sequence[tuple[int, bytes]]) -> None:
        """Queue (hash, bytes) blocks for kvtier; never blocks, never raises."""
        if self._closed or not blocks:
            return
        if self._is_down():
            self.num_dropped += len(blocks)
            return
        with self._cond:
            self._pending.extend(blocks)
            while len(self._pending) > self.config.max_pending_blocks:
                self._pending.popleft()
                self.num_dropped += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._store_loop, name="kvtier-store", daemon=True)
                self._thread.start()
            self._cond.notify()

    def num_pending(self) -> int:
        with self._cond:
            return len(self._pending)

    def close(self) -> None:
        self._closed = True
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=self.config.store_timeout_s + 1)
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def _store_loop(self) -> None:
        sock: zmq.Socket | None = None
        try:
            while not self._closed:
                with self._cond:
                    while not self._pending and not self._closed:
                        self._cond.wait()
                    batch: list[tuple[int, bytes]] = []
                    num_bytes = 0
                    while self._pending and (not batch or num_bytes + len(self._pending[0][1])
                                             <= self.config.max_message_bytes):
                        block = self._pending.popleft()
                        batch.append(block)
                        num_bytes += len(block[1])
                if not batch:
                    continue
                msg = TierStore(request_id=new_id("ts"), worker_id=self.config.worker_id,
                                blocks=InlineTransfer.pack(batch), model_id=self.config.model_id)
                try:
                    sock = sock or self._socket()
                    reply = _request(sock, msg, self.config.store_timeout_s)
                    if isinstance(reply, TierStored):
                        self.num_stored += reply.num_stored + reply.num_present
                        self.num_dropped += reply.num_rejected
                        if reply.num_rejected:
                            log.warning("tier_blocks_rejected", num_rejected=reply.num_rejected,
                                        block_bytes=len(batch[0][1]))
                except (TransportTimeout, RemoteError, zmq.ZMQError) as exc:
                    self.num_dropped += len(batch)
                    if sock is not None:
                        sock.close(linger=0)
                        sock = None
                    self._failed("store", exc)
                    with self._cond:
                        self.num_dropped += len(self._pending)
                        self._pending.clear()
        finally:
            if sock is not None:
                sock.close(linger=0)

    # ----------------------------------------------------------------------------------------- internals

    def _socket(self) -> zmq.Socket:
        if self._ctx is None:
            self._ctx = zmq.Context()
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, self.config.hwm)
        sock.setsockopt(zmq.RCVHWM, self.config.hwm)
        sock.setsockopt(zmq.SNDTIMEO, int(self.config.store_timeout_s * 1000))
        # CURVE: kvtier's public key is checked, and its ZAP allow-list checks ours (a refused handshake looks
        # like a kvtier that never answers: a timeout, so a recompute).
        secure_client(sock, self.config.curve.toward("kvtier") if self.config.curve is not None else None)
        sock.connect(self.config.endpoint)
        return sock

    def _request_main(self, msg: Message, timeout_s: float) -> Message:
        if self._sock is None:
            self._sock = self._socket()
        try:
            reply = _request(self._sock, msg, timeout_s)
            self._answered()
            return reply
        except (TransportTimeout, zmq.ZMQError):
            self._sock.close(linger=0)  # a fresh socket next time: no stale reply can match
            self._sock = None
            raise

    def _is_down(self) -> bool:
        return time.monotonic() < self._down_until

    def _failed(self, what: str, exc: BaseException) -> None:
        """Back off; the wait doubles per failure in a row (up to 8x): a probe that times out stalls vLLM's
        scheduler for its timeout, so a dead kvtier must cost that rarely, not once a second."""
        self.num_failures += 1
        self._num_failed_in_row = min(self._num_failed_in_row + 1, 4)
        # Jittered (common.backoff): the model-runner and scheduler processes of every engine retry apart.
        wait_s = backoff_s(self._num_failed_in_row, self.config.backoff_s, self.config.backoff_s * 8)
        if not self._is_down():
            log.warning("kvtier_unavailable", what=what, error=repr(exc), backoff_s=wait_s)
        self._down_until = time.monotonic() + wait_s

    def _answered(self) -> None:
        self._num_failed_in_row = 0


def _request(sock: zmq.Socket, msg: Message, timeout_s: float) -> Message:
    """Send ``msg`` and wait for the reply with its request id (others are stale: dropped)."""
    deadline = time.monotonic() + timeout_s
    sock.send(protocol.encode(msg), copy=True)
    rid = msg.request_id  # type: ignore[union-attr]
    while True:
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        if remaining_ms <= 0 or not sock.poll(remaining_ms, zmq.POLLIN):
            raise TransportTimeout(f"kvtier gave no reply to {type(msg).__name__} in {timeout_s} s")
        reply = protocol.decode(sock.recv(copy=True))
        if getattr(reply, "request_id", None) != rid:
            continue
        if isinstance(reply, ErrorReply):
            raise RemoteError(reply.code, reply.message)
        return reply
