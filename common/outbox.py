"""Replies to a ROUTER server's peers, gathered over one event-loop turn and sent as few frames as possible.

A zero-delay engine step yields a token for every running request at once; sent alone, each ``Tokens`` costs a
ZeroMQ send on the worker and a receive on the frontend (most of both processes' CPU per token). The outbox
queues them per peer and, at the end of the loop turn, sends each peer's consecutive ``Tokens`` as one
``TokensBatch`` (other messages alone, order kept). Nothing is lost: a peer whose queue is full gets the rest
by awaited sends, in order, with later messages queued behind; a peer that is gone (a ``mandatory`` server's
EHOSTUNREACH) or a message that cannot be sent is handed to ``on_undelivered``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog
import zmq

from common.errors import ProtocolError
from common.protocol import Message, Tokens, TokensBatch
from common.transport import Server

log = structlog.get_logger()

_MAX_BATCH = 256  # Tokens per frame: keeps a frame far below the message cap even with logprobs

# (peer identity, the messages it did not get, True when the peer is gone; False: they could not be sent)
OnUndelivered = Callable[[bytes, list[Message], bool], None]


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
    def __init__(self, server: Server, on_undelivered: OnUndelivered) -> None:
        self._server = server
        self._on_undelivered = on_undelivered
        self._pending: dict[bytes, list[Message]] = {}
        self._blocked: set[bytes] = set()  # peers with an awaited send under way (their queue was full)
        self._handle: asyncio.Handle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def put(self, identity: bytes, msg: Message) -> None:
        pending = self._pending.get(identity)
        if pending is None:
            self._pending[identity] = pending = []
        pending.append(msg)
        if self._handle is None:
            self._handle = asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Send what is queued now (peers with an awaited send under way keep theirs until it is done)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        for identity in [i for i in self._pending if i not in self._blocked]:
            self._send(identity, frames(self._pending.pop(identity)))

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
