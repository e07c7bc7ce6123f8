"""A small HTTP/1.1 server on asyncio + httptools, made for an API frontend's hot path.

Kept over uvicorn and granian by measurement (bench/frontend_servers.py, numbers in docs/measuring.md):
per request it costs one parser callback set and one handler task, no middleware layers.

Every request is answered in the order it came (pipelining), errors the server finds itself (400 malformed,
413, 431) included: they wait their turn and then close the connection. Limits (HttpConfig): header bytes,
body bytes (decided from Content-Length before reading), header/body/keep-alive timeouts, open connections,
requests read ahead. ``Expect: 100-continue`` gets ``100 Continue``; ``Upgrade`` (h2c, websocket) is ignored:
the request is answered over HTTP/1.1. A client that hangs up cancels its handler.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httptools
import structlog

from services.frontend.http_messages import HttpConfig, Request, Response, error_body

__all__ = ["HttpConfig", "Request", "Response", "serve"]

log = structlog.get_logger(__name__)

# Bytes a connection buffers within one loop turn before it writes them at once.
_FLUSH_BYTES = 64 * 1024
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# After an error answer the server itself gives (413, 431, 400), the connection reads and drops what the client
# is still sending for this long before closing: closing with unread bytes would reset the connection, and the
# client, busy sending its body, would never read the answer.
_LINGER_S = 2.0

Handler = Callable[[Request, Response], Awaitable[None]]
OnError = Callable[[Response, BaseException], None]


@dataclass(frozen=True, slots=True)
class _Reject:
    """An error the server answers itself, in its turn, before closing the connection."""

    status: int
    body: bytes


class _Server:
    def __init__(self, handler: Handler, config: HttpConfig, on_error: OnError) -> None:
        self.handler = handler
        self.config = config
        self.on_error = on_error
        self.num_connections = 0


class _Connection(asyncio.Protocol):
    def __init__(self, server: _Server) -> None:
        self._server = server
        self._config = server.config
        self._loop = asyncio.get_running_loop()
        # Its callbacks are this object's methods: a reference cycle, broken in connection_lost.
        self._parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._body_len = 0
        self._in_head = True  # the next bytes belong to a request line or headers
        self._head_bytes = 0
        self._num_heads = 0  # headers parsed so far on this connection
        self._mid_message = False
        self._stopped = False  # a _Reject is queued: nothing more is read
        self._paused = False
        self._pending_continue = False
        self._queue: deque[Request | _Reject] = deque()
        self._wake = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._current: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._can_write = asyncio.Event()
        self._can_write.set()
        self.closed = False
        # Writes wait here until the loop turns, then go out as one send: a streamed response's headers,
        # opening chunk and first token, or several tokens that arrived together, cost one syscall.
        self._out: list[bytes] = []
        self._out_bytes = 0

    # ---- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._server.num_connections += 1
        if self._server.num_connections > self._config.max_connections:
            self._stopped = True
            Response(self, keep_alive=False).send(503, error_body("too many connections", "overloaded"))
            self._flush()
            transport.close()
            return
        self._worker = self._loop.create_task(self._serve())
        self._arm(self._config.header_timeout_s)

    def data_received(self, data: bytes) -> None:
        if self._stopped:
            return
        if self._in_head:
            room = self._config.max_header_bytes - self._head_bytes
            if len(data) > room:
                # Feed only up to the cap: headers past it are never buffered (by us or the parser).
                heads = self._num_heads
                if not self._feed(data[:room]) or self._stopped:
                    return
                if self._num_heads == heads:
                    self._reject(431, error_body("request headers too large", "headers_too_large"))
                    return
                self.data_received(data[room:])
                return
            self._head_bytes += len(data)
        self._feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._server.num_connections -= 1
        self._disarm()
        self._out.clear()
        # A body cut off mid-way and requests read ahead go now, not when the connection's cycles are collected.
        self._body = []
        self._queue.clear()
        self._can_write.set()
        if self._current is not None:
            # The serve task awaits the handler and so takes whatever it ends with (cancellation or an error
            # from its cleanup): never an unretrieved task exception logged with a long traceback.
            self._current.cancel()
        elif self._worker is not None:
            self._worker.cancel()
        # A closed connection goes with its last reference, not at the garbage collector's next full run: it
        # drops the parser (whose callbacks are this object's methods) and the serve task (whose CancelledError
        # keeps the task's frame, and so this object, in its traceback). A slowloris socket lives 10 s, long
        # enough to reach the collector's oldest generation: left in these cycles, each 20 s of hostile load
        # (bench/frontend_hostile.py) kept ~2 MiB more of the frontend's memory.
        self._parser = None
        self._worker = None

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    def _feed(self, data: bytes) -> bool:
        try:
            self._parser.feed_data(data)  # type: ignore[union-attr]  # None only after connection_lost
        except httptools.HttpParserUpgrade as exc:
            # Upgrade (h2c, websocket) is not offered: the request was complete and is answered over HTTP/1.1.
            # The parser stops at an upgrade before any body, so one with a body cannot be read: refused.
            if self._headers.get("content-length", "0") != "0" or "transfer-encoding" in self._headers:
                if self._queue and isinstance(self._queue[-1], Request):
                    self._queue.pop()
                self._reject(400, error_body("Upgrade with a request body is not supported"))
                return False
            self._parser = httptools.HttpRequestParser(self)
            offset = exc.args[0] if exc.args and isinstance(exc.args[0], int) else len(data)
            return self._feed(data[offset:]) if offset < len(data) else True
        except httptools.HttpParserError:
            self._reject(400, error_body("malformed HTTP request"))
            return False
        return True

    # ---- httptools callbacks
    def on_message_begin(self) -> None:
        if self._stopped:
            return
        self._url = b""
        self._headers = {}
        self._body = []
        self._body_len = 0
        self._mid_message = True
        self._arm(self._config.header_timeout_s)

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if self._stopped:
            return
        self._in_head = False
        self._head_bytes = 0
        self._num_heads += 1
        length = self._headers.get("content-length", "")
        if length.isdigit() and int(length) > self._config.max_body_bytes:
            self._reject(413, error_body("request body too large", "body_too_large"))
            return
        if self._headers.get("expect", "").lower() == "100-continue":
            self._pending_continue = True
            self._send_continue()
        self._arm(self._config.body_timeout_s)

    def on_body(self, body: bytes) -> None:
        if self._stopped:
            return
        self._body_len += len(body)
        if self._body_len > self._config.max_body_bytes:  # chunked: no Content-Length to decide from
            self._reject(413, error_body("request body too large", "body_too_large"))
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._stopped:
            return
        self._in_head = True
        self._head_bytes = 0
        self._mid_message = False
        self._pending_continue = False
        self._disarm()
        path, _, query = self._url.decode("latin-1").partition("?")
        parser = self._parser
        assert parser is not None  # called from _feed only
        body = b"".join(self._body)
        # The chunks go now: an idle keep-alive connection lives until its timeout, and a 7 MB body's chunks held
        # that long kept the memory of every large prompt.
        self._body = []
        self._enqueue(Request(method=parser.get_method().decode(), path=path, query=query, headers=self._headers,
                              body=body, keep_alive=parser.should_keep_alive(),
                              http10=parser.get_http_version() == "1.0"))
        if len(self._queue) >= self._config.max_pipelined and self._transport is not None:
            self._transport.pause_reading()
            self._paused = True

    # ---- serving
    def _enqueue(self, item: Request | _Reject) -> None:
        self._queue.append(item)
        self._wake.set()

    def _reject(self, status: int, body: bytes) -> None:
        """Answer ``status`` after every request before it, then close; nothing more is read."""
        if self._stopped:
            return
        self._stopped = True
        self._disarm()
        if self._transport is not None and not self._paused:
            self._transport.pause_reading()
            self._paused = True
        self._enqueue(_Reject(status, body))

    async def _serve(self) -> None:
        while True:
            while not self._queue:
                self._wake.clear()
                await self._wake.wait()
            # Popped as it is answered, and never left in this frame: a cancelled task keeps its frame (and so the
            # last request's body) in its exception's traceback until the garbage collector runs.
            item = self._queue.popleft()
            if self._paused and not self._stopped and len(self._queue) < self._config.max_pipelined:
                self._paused = False
                self._transport.resume_reading()  # type: ignore[union-attr]
            if isinstance(item, _Reject):
                Response(self, keep_alive=False).send(item.status, item.body)
                self._linger_close()
                return
            resp = Response(self, item.keep_alive, head_only=item.method == "HEAD", http10=item.http10)
            self._current = self._loop.create_task(self._server.handler(item, resp))
            del item
            try:
                await self._current
            except asyncio.CancelledError:
                if self.closed:
                    return
                raise
            except Exception as exc:
                if not self.closed and not resp.done:
                    self._server.on_error(resp, exc)
            finally:
                self._current = None
            if self.closed:
                return
            if not resp.done or not resp.keep_alive:  # a half-written response cannot be followed by another
                self._close()
                return
            self._send_continue()
            if not self._queue and not self._mid_message:
                self._arm(self._config.keepalive_timeout_s)

    def _send_continue(self) -> None:
        # Only between responses: a 100 inside another response's bytes would corrupt it.
        if self._pending_continue and self._current is None and not self._queue:
            self._pending_continue = False
            self.write(_CONTINUE)

    def _arm(self, timeout_s: float) -> None:
        self._disarm()
        self._timer = self._loop.call_later(timeout_s, self._timed_out)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        if self._paused and not self._stopped:
            # We stopped reading (requests queued ahead): the rest may be waiting in the socket, not late.
            self._arm(self._config.header_timeout_s)
            return
        if self._current is None and not self._queue and self._mid_message:
            Response(self, keep_alive=False).send(408, error_body("request not received in time", "timeout"))
        self._close()

    def _close(self) -> None:
        self._flush()
        if self._transport is not None:
            self._transport.close()

    def _linger_close(self) -> None:
        transport = self._transport
        self._flush()
        if transport is None or self.closed or not transport.can_write_eof():
            self._close()
            return
        transport.write_eof()  # the answer, then FIN; what comes in meanwhile is dropped (self._stopped)
        self._paused = False
        transport.resume_reading()
        self._disarm()
        self._timer = self._loop.call_later(_LINGER_S, transport.close)

    def eof_received(self) -> bool:
        return False  # the client is done sending: close (a half-open connection serves nobody)

    def write(self, data: bytes) -> None:
        if self.closed or self._transport is None:
            return
        out = self._out
        if not out:
            self._loop.call_soon(self._flush)
        out.append(data)
        self._out_bytes += len(data)
        if self._out_bytes >= _FLUSH_BYTES:  # a big burst goes out now, so the transport can push back
            self._flush()

    def _flush(self) -> None:
        out = self._out
        if not out:
            return
        self._out = []
        self._out_bytes = 0
        if self.closed or self._transport is None:
            return
        if len(out) == 1:
            self._transport.write(out[0])
        else:
            self._transport.write(b"".join(out))

    async def drain(self) -> None:
        if not self._can_write.is_set():
            await self._can_write.wait()
        if self.closed:
            raise ConnectionResetError("client disconnected")


async def serve(handler: Handler, config: HttpConfig, on_error: OnError,
                started: Callable[[int], None] | None = None) -> None:
    """Serve forever; ``started`` gets the bound port (useful with port 0)."""
    loop = asyncio.get_running_loop()
    state = _Server(handler, config, on_error)
    server = await loop.create_server(lambda: _Connection(state), config.host, config.port, reuse_address=True,
                                      reuse_port=config.reuse_port, backlog=2048)
    port = server.sockets[0].getsockname()[1]
    if started is not None:
        started(port)
    async with server:
        await server.serve_forever()
