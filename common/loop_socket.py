"""A ZeroMQ socket driven straight from the asyncio event loop, for the transport's hot paths.

pyzmq's asyncio layer makes a future for every send and receive and checks ZMQ_EVENTS (a ``poll`` syscall in
libzmq) around each: 9 times per request in the frontend, 5 in the router, 7 in a worker (strace, serving-layer
bench). Here sends and receives are the plain socket's non-blocking calls; only a receive that finds nothing waits,
on the socket's FD (``loop.add_reader``). ``python -m bench.loop_socket`` (one process, ROUTER echo and DEALER
at 64 in flight): 15-16 us of CPU per round trip against 29-30 us through pyzmq's asyncio sockets.

libzmq's FD is edge-triggered: it says the socket's events *changed*, and any operation on the socket may take
that signal while leaving the message queued (a send through a plain shadow once left a worker deaf to new
requests). So a receive looks at ZMQ_EVENTS once before it sleeps on the FD, and operations made while anyone
waits schedule one ZMQ_EVENTS check for the end of the loop turn, however many the turn made. A waiting send also
retries on a timer: see ``_wait_writable``. One receiver at a time per socket (each of ours has one reader task).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

# An awaited send to a full peer retries after this long, doubling up to RETRY_MAX_S, besides every change of
# the socket's events.
RETRY_FIRST_S = 0.001
RETRY_MAX_S = 0.1

# As plain ints: pyzmq's enum forms cost an enum construction or operation each (~0.7 us a check, measured).
_EVENTS, _POLLIN, _POLLOUT, _NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.POLLOUT), int(zmq.NOBLOCK)


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class LoopSocket:
    def __init__(self, sock: zmq.Socket) -> None:
        # The plain socket under an asyncio one: its own async methods must not be used beside this.
        self.sock = zmq.Socket.shadow(sock.underlying)
        self._fd = self.sock.getsockopt(zmq.FD)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._recv_waiter: asyncio.Future[None] | None = None
        self._send_waiters: deque[asyncio.Future[None]] = deque()
        self._check_scheduled = False
        self._closed = False

    def _watch(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(self._fd, self._check)
        return self._loop

    def _check(self) -> None:
        """The FD fired, or a send may have taken its signal: wake whoever can go on now. Reading ZMQ_EVENTS
        also clears the FD (the loop's poll is level-triggered: it would fire again otherwise)."""
        self._check_scheduled = False
        if self._closed:
            return
        events = self.sock.getsockopt(_EVENTS)
        if events & _POLLIN and self._recv_waiter is not None and not self._recv_waiter.done():
            self._recv_waiter.set_result(None)
        if events & _POLLOUT:
            for fut in self._send_waiters:
                _wake(fut)

    def _after_send(self) -> None:
        """After an operation: one ZMQ_EVENTS check at the end of this loop turn if anyone waits."""
        if not self._check_scheduled and (self._recv_waiter is not None or self._send_waiters):
            self._check_scheduled = True
            self._watch().call_soon(self._check)

    async def _wait_readable(self) -> None:
        if self._recv_waiter is not None:
            raise RuntimeError("one receiver at a time on a LoopSocket")
        if self._closed:
            raise asyncio.CancelledError
        fut = self._recv_waiter = self._watch().create_future()
        try:
            if self.sock.getsockopt(_EVENTS) & _POLLIN:  # the last operation may have taken the signal
                return
            await fut
        finally:
            self._recv_waiter = None

    async def recv_multipart(self, copy: bool = True) -> list:
        while True:
            try:
                return self.sock.recv_multipart(_NOBLOCK, copy=copy)
            except zmq.Again:
                await self._wait_readable()

    async def recv(self, copy: bool = True):
        while True:
            try:
                return self.sock.recv(_NOBLOCK, copy=copy)
            except zmq.Again:
                await self._wait_readable()

    def send_multipart_nowait(self, frames, copy: bool = True) -> None:
        """Queue ``frames`` now or raise (zmq.Again: no room, or no peer to queue for; EHOSTUNREACH...)."""
        try:
            self.sock.send_multipart(frames, _NOBLOCK, copy=copy)
        finally:
            self._after_send()

    def send_nowait(self, data, copy: bool = True) -> None:
        try:
            self.sock.send(data, _NOBLOCK, copy=copy)
        finally:
            self._after_send()

    async def _wait_writable(self, attempt: int) -> None:
        """Until the socket's events change, or a retry timer (1 ms, doubling to 100 ms) runs out. POLLOUT says
        only that *some* peer has room (a mandatory ROUTER with one full peer keeps it set), and the failed
        retry itself can take the signal of that peer's room: the timer bounds both, with no spinning."""
        if self._closed:
            raise asyncio.CancelledError
        if attempt == 0 and self.sock.getsockopt(_EVENTS) & _POLLOUT:
            return
        loop = self._watch()
        fut = loop.create_future()
        self._send_waiters.append(fut)
        timer = loop.call_later(min(RETRY_FIRST_S * 2 ** attempt, RETRY_MAX_S), _wake, fut)
        try:
            await fut
        finally:
            timer.cancel()
            if fut in self._send_waiters:
                self._send_waiters.remove(fut)

    async def send_multipart(self, frames, copy: bool = True) -> None:
        """Send, waiting for room (a DEALER with no peer yet, a mandatory ROUTER's full queue)."""
        attempt = 0
        while True:
            try:
                return self.send_multipart_nowait(frames, copy=copy)
            except zmq.Again:
                await self._wait_writable(attempt)
                attempt += 1

    async def send(self, data, copy: bool = True) -> None:
        attempt = 0
        while True:
            try:
                return self.send_nowait(data, copy=copy)
            except zmq.Again:
                await self._wait_writable(attempt)
                attempt += 1

    def drain(self, sink: Callable[[Any], None], limit: int, multipart: bool = False, copy: bool = True) -> None:
        """Hand up to ``limit`` already-queued messages to ``sink``; never waits. Call it right after an awaited
        receive returned (nothing read here then hides a wake-up from the next one)."""
        recv = self.sock.recv_multipart if multipart else self.sock.recv
        try:
            for _ in range(limit):
                try:
                    data = recv(_NOBLOCK, copy=copy)
                except zmq.Again:
                    return
                sink(data)
        finally:
            self._after_send()  # receives can take a signal a waiting send needs, as sends can a receive's

    def close(self) -> None:
        """Stop watching the FD (before the socket closes) and cancel whoever waits."""
        if self._closed:
            return
        self._closed = True
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
        for fut in (self._recv_waiter, *self._send_waiters):
            if fut is not None and not fut.done():
                fut.cancel()
        self._send_waiters.clear()
