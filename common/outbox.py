"""Replies to a ROUTER server's peers, gathered over one event-loop turn and sent as few frames as possible.

A zero-delay engine step yields a token for every running request at once; sent alone, each ``Tokens`` costs a
ZeroMQ send on the worker and a receive on the frontend (most of both processes' CPU per token). The outbox
queues them per peer and, at the end of the loop turn, sends each peer's consecutive ``Tokens`` as one
``TokensBatch`` (other messages alone, order kept). Nothing is lost: a peer whose queue is full gets the rest
by awaited sends, in order, with later messages queued behind; a peer that is gone (a ``mandatory`` server's
EHOSTUNREACH) or a message that cannot be sent is handed to ``on_undelivered``.

Bounded: libzmq queues at most ``socket_frames`` frames per peer; while a peer's awaited send is under way, what is put for it waits in its backlog, at most
``OutboxLimits`` messages and bytes. Over either, ``room(identity)`` (awaited by the producer before each put)
pauses that peer's producers, and only theirs, until the backlog has gone out; a peer that stays over for
``stall_timeout_s`` raises ``PeerStalled`` in each of them (the worker aborts those requests, freeing their KV
blocks) and ``drop`` takes their queued replies out of the backlog. At most about twice the limits are held per
peer: the backlog, plus the one an awaited send is working through.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import structlog
import zmq

from common import protocol
from common.errors import ProtocolError
from common.protocol import Message, Tokens, TokensBatch
from common.transport import Server

log = structlog.get_logger()

_MAX_BATCH = 256  # Tokens per frame: keeps a frame far below the message cap even with logprobs

# (peer identity, the messages it did not get, True when the peer is gone; False: they could not be sent)
OnUndelivered = Callable[[bytes, list[Message], bool], None]


@dataclass(frozen=True, slots=True)
class OutboxLimits:
    max_messages: int = 20_000  # per peer, queued behind an awaited send
    max_bytes: int = 64 * 1024 * 1024  # per peer, encoded
    stall_timeout_s: float = 30.0  # a peer over a limit this long: its producers get PeerStalled
    # Frames libzmq queues per peer before a send answers zmq.Again and the backlog starts: the server's
    # high-water mark, set at its bind (``Server(..., TransportConfig(hwm=...))``; the transport's default,
    # 100,000, would hold hundreds of MB of token batches for a peer that stopped reading).
    socket_frames: int = 1000


class PeerStalled(Exception):
    """The peer has read nothing for ``stall_timeout_s`` while its backlog was full."""


def frames(msgs: list[Message]) -> list[Message]:
    """``msgs`` as frames: each run of consecutive ``Tokens`` one ``TokensBatch`` (a lone one stays as it is)."""
    out: list[Message] = []
    run: list[Tokens] = []

    def close_run() -> None:
        if len(run) == 1:
            out.append(run[0])
        elif run:
            out.append(TokensBatch(items=tuple(run)))
        run.clear()

    for msg in msgs:
        if isinstance(msg, Tokens):
            run.append(msg)
            if len(run) == _MAX_BATCH:
                close_run()
        else:
            close_run()
            out.append(msg)
    close_run()
    return out


def unbatch(frame_list: list[Message]) -> list[Message]:
    out: list[Message] = []
    for frame in frame_list:
        out.extend(frame.items if isinstance(frame, TokensBatch) else (frame,))
    return out


def _split(queue: list[Message], i: int, exc: Exception) -> bool:
    """A batch over the message cap goes again as its items (each alone may fit): True when split."""
    frame = queue[i]
    if isinstance(exc, ProtocolError) and isinstance(frame, TokensBatch):
        queue[i:i + 1] = list(frame.items)
        return True
    return False


class PeerOutbox:
    def __init__(self, server: Server, on_undelivered: OnUndelivered, limits: OutboxLimits = OutboxLimits()) -> None:
        self._server = server
        self._on_undelivered = on_undelivered
        self.limits = limits
        self._pending: dict[bytes, list[Message]] = {}
        self._blocked: set[bytes] = set()  # peers with an awaited send under way (their queue was full)
        self._backlog_bytes: dict[bytes, int] = {}  # encoded bytes put for a blocked peer, not yet sent
        self._room: dict[bytes, asyncio.Event] = {}  # set when that peer's backlog is under the limits
        self._handle: asyncio.Handle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.num_stalled = 0  # producers that gave up on a peer (PeerStalled)

    def put(self, identity: bytes, msg: Message) -> None:
        pending = self._pending.get(identity)
        if pending is None:
            self._pending[identity] = pending = []
        pending.append(msg)
        if identity in self._blocked:  # only the slow path pays for measuring
            self._backlog_bytes[identity] = self._backlog_bytes.get(identity, 0) + len(protocol.encode(msg))
            if self._over(identity):
                self._room.setdefault(identity, asyncio.Event()).clear()
        if self._handle is None:
            self._handle = asyncio.get_running_loop().call_soon(self.flush)

    def full(self, identity: bytes) -> bool:
        """Whether ``identity``'s producers must await ``room`` before their next put (rarely: the hot path
        checks this and skips the await)."""
        return self._over(identity)

    def _over(self, identity: bytes) -> bool:
        return (identity in self._blocked
                and (len(self._pending.get(identity, ())) >= self.limits.max_messages
                     or self._backlog_bytes.get(identity, 0) >= self.limits.max_bytes))

    def backlog(self, identity: bytes) -> tuple[int, int]:
        """(messages, bytes) waiting for ``identity`` behind its awaited send."""
        if identity not in self._blocked:
            return 0, 0
        return len(self._pending.get(identity, ())), self._backlog_bytes.get(identity, 0)

    async def room(self, identity: bytes) -> None:
        """Return when ``identity``'s backlog is under the limits (at once, nearly always); raise PeerStalled
        when it stays over them for ``stall_timeout_s``."""
        if not self._over(identity):
            return
        event = self._room.setdefault(identity, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), self.limits.stall_timeout_s)
        except asyncio.TimeoutError:
            self.num_stalled += 1
            raise PeerStalled(f"peer read nothing for {self.limits.stall_timeout_s}s with "
                              f"{self.backlog(identity)[0]} messages queued") from None

    def drop(self, identity: bytes, request_id: str) -> int:
        """Take ``request_id``'s queued messages out of ``identity``'s backlog (an aborted request's tokens
        nobody will read); how many."""
        pending = self._pending.get(identity)
        if not pending:
            return 0
        kept = [m for m in pending if getattr(m, "request_id", None) != request_id]
        dropped = len(pending) - len(kept)
        if dropped and identity in self._blocked:
            self._backlog_bytes[identity] = sum(len(protocol.encode(m)) for m in kept)
        self._pending[identity] = kept
        self._wake(identity)
        return dropped

    def _wake(self, identity: bytes) -> None:
        event = self._room.get(identity)
        if event is not None and not self._over(identity):
            event.set()

    def flush(self) -> None:
        """Send what is queued now (peers with an awaited send under way keep theirs until it is done)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        for identity in [i for i in self._pending if i not in self._blocked]:
            self._backlog_bytes.pop(identity, None)
            self._send(identity, frames(self._pending.pop(identity)))
            self._wake(identity)

    def _send(self, identity: bytes, frame_list: list[Message]) -> None:
        queue, i = list(frame_list), 0
        while i < len(queue):
            try:
                self._server.send_nowait(identity, queue[i])
            except zmq.Again:  # the peer reads slower than we produce: wait for room, lose nothing
                self._blocked.add(identity)
                task = asyncio.get_running_loop().create_task(self._send_awaited(identity, queue[i:]))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                return
            except (zmq.ZMQError, ProtocolError) as exc:
                if _split(queue, i, exc):
                    continue
                if self._undelivered(identity, queue[i:], exc):
                    return
            i += 1

    async def _send_awaited(self, identity: bytes, frame_list: list[Message]) -> None:
        queue, i = list(frame_list), 0
        try:
            while i < len(queue):
                try:
                    await self._server.send(identity, queue[i])
                except (zmq.ZMQError, ProtocolError) as exc:
                    if _split(queue, i, exc):
                        continue
                    if self._undelivered(identity, queue[i:], exc):
                        return
                i += 1
        finally:
            self._blocked.discard(identity)
            self._wake(identity)  # its producers go on: the backlog is sent at the next flush
            if identity in self._pending and self._handle is None:
                self._handle = asyncio.get_running_loop().call_soon(self.flush)

    def _undelivered(self, identity: bytes, rest: list[Message], exc: Exception) -> bool:
        """Hand the failed frame (or, with the peer gone, all of ``rest``) over; True when the peer is gone."""
        if isinstance(exc, zmq.ZMQError) and exc.errno == zmq.EHOSTUNREACH:
            self._on_undelivered(identity, unbatch(rest), True)
            return True
        log.warning("send_failed", message=type(rest[0]).__name__, error=str(exc))
        self._on_undelivered(identity, unbatch(rest[:1]), False)
        return False

    async def close(self) -> None:
        """Send what is queued and wait for awaited sends under way."""
        self.flush()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
