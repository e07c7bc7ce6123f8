"""A ZeroMQ socket driven straight from the asyncio event loop, for the transport's hot paths.

pyzmq's asyncio layer makes a future for every send and receive and checks ZMQ_EVENTS (a ``poll`` syscall in
libzmq) around each: 9 times per request in the frontend, 5 in the router, 7 in a worker (strace, serving-layer
bench). Here sends and receives are the plain socket's non-blocking calls; only a receive that finds nothing waits,
on the socket's FD (``loop.add_reader``). A micro-benchmark (one process, ROUTER echo and DEALER
at 64 in flight): 15-16 us of CPU per round trip against 29-30 us through pyzmq's asyncio sockets.

libzmq's FD is edge-triggered: it says the socket's events *changed*, and any operation on the socket, a send
included, may take that signal while leaving the message queued (a send through a plain shadow once left a worker
deaf to new requests). So a receive looks at ZMQ_EVENTS once before it sleeps on the FD, and sends made while a
receive waits schedule one ZMQ_EVENTS check for the end of the loop turn, however many sends the turn made.
One receiver at a time per socket (each of ours has one reader task).
"""

from __future__ import annotations

import asyncio
from collections import deque

import zmq


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
        events = self.sock.getsockopt(zmq.EVENTS)
        if events & zmq.POLLIN and self._recv_waiter is not None and not self._recv_waiter.done():
            self._recv_waiter.set_result(None)
        if events & zmq.POLLOUT:
            while self._send_waiters:
                fut = self._send_waiters.popleft()
                if not fut.done():
                    fut.set_result(None)

    def _after_send(self) -> None:
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
            if self.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:  # the last operation may have taken the signal
                return
            await fut
        finally:
            self._recv_waiter = None

    async def recv_multipart(self, copy: bool = True) -> list:
        while True:
            try:
                return self.sock.recv_multipart(zmq.NOBLOCK, copy=copy)
            except zmq.Again:
                await self._wait_readable()

    async def recv(self, copy: bool = True):
        while True:
            try:
                return self.sock.recv(zmq.NOBLOCK, copy=copy)
            except zmq.Again:
                await self._wait_readable()

    def send_multipart_nowait(self, frames, copy: bool = True) -> None:
        """Queue ``frames`` now or raise (zmq.Again: no room, or no peer to queue for; EHOSTUNREACH...)."""
        try:
            self.sock.send_multipart(frames, zmq.NOBLOCK, copy=copy)
        finally:
            self._after_send()

    def send_nowait(self, data, copy: bool = True) -> None:
        try:
            self.sock.send(data, zmq.NOBLOCK, copy=copy)
        finally:
            self._after_send()

    async def _wait_writable(self, look_first: bool) -> None:
        """Until the socket's events change (``look_first``: return at once if ZMQ_POLLOUT is set now). A ROUTER
        reports POLLOUT while any peer has room, so a send to a full one fails again after a wake: the retry then
        waits for the next change instead of spinning."""
        if self._closed:
            raise asyncio.CancelledError
        if look_first and self.sock.getsockopt(zmq.EVENTS) & zmq.POLLOUT:
            return
        fut = self._watch().create_future()
        self._send_waiters.append(fut)
        await fut

    async def send_multipart(self, frames, copy: bool = True) -> None:
        """Send, waiting for room (a DEALER with no peer yet, a mandatory ROUTER's full queue)."""
        look_first = True
        while True:
            try:
                return self.send_multipart_nowait(frames, copy=copy)
            except zmq.Again:
                await self._wait_writable(look_first)
                look_first = False

    async def send(self, data, copy: bool = True) -> None:
        look_first = True
        while True:
            try:
                return self.send_nowait(data, copy=copy)
            except zmq.Again:
                await self._wait_writable(look_first)
                look_first = False

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
