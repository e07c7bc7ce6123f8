"""A small HTTP/1.1 server on asyncio + httptools, made for an API frontend's hot path.

Chosen over ASGI stacks by measurement (bench/frontend.py): per request it costs one parser callback set and
one handler task, no middleware layers. Keep-alive, pipelining (answered in order), body size cap (413),
chunked streaming with back-pressure, and a client that hangs up cancels its handler.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus

import httptools
import structlog

log = structlog.get_logger(__name__)

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
# Bytes a connection buffers within one loop turn before it writes them at once.
_FLUSH_BYTES = 64 * 1024


@dataclass(slots=True)
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool


class Response:
    """Writes one response on a connection: either ``send`` whole, or ``start`` + ``write``... + ``end``."""

    __slots__ = ("_conn", "_keep_alive", "started", "done", "status")

    def __init__(self, conn: _Connection, keep_alive: bool) -> None:
        self._conn = conn
        self._keep_alive = keep_alive
        self.started = False  # headers are out
        self.done = False
        self.status = 0

    @property
    def disconnected(self) -> bool:
        return self._conn.closed

    def send(self, status: int, body: bytes, content_type: bytes = b"application/json",
             headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        head = [b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n"
                % (status, _REASONS.get(status, b""), content_type, len(body))]
        for name, value in headers:
            head.append(b"%s: %s\r\n" % (name, value))
        if not self._keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        head.append(body)
        self._conn.write(b"".join(head))
        self.started = self.done = True
        self.status = status

    def start(self, status: int, content_type: bytes, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        head = [b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ntransfer-encoding: chunked\r\ncache-control: no-cache\r\n"
                % (status, _REASONS.get(status, b""), content_type)]
        for name, value in headers:
            head.append(b"%s: %s\r\n" % (name, value))
        if not self._keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        self._conn.write(b"".join(head))
        self.started = True
        self.status = status

    async def write(self, chunk: bytes) -> None:
        if chunk:
            self._conn.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await self._conn.drain()

    def end(self, last_chunk: bytes = b"") -> None:
        if last_chunk:
            self._conn.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(last_chunk), last_chunk))
        else:
            self._conn.write(b"0\r\n\r\n")
        self.done = True


Handler = Callable[[Request, Response], Awaitable[None]]


@dataclass(frozen=True)
class HttpConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    max_body_bytes: int = 8 * 1024 * 1024
    # Requests parsed ahead of the one being answered on one connection (HTTP pipelining bound).
    max_pipelined: int = 16


class _Connection(asyncio.Protocol):
    def __init__(self, handler: Handler, config: HttpConfig, on_error: Callable[[Response, BaseException], None]):
        self._handler = handler
        self._config = config
        self._on_error = on_error
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._body_len = 0
        self._too_large = False
        self._queue: asyncio.Queue[Request] = asyncio.Queue(config.max_pipelined)
        self._worker: asyncio.Task[None] | None = None
        self._current: asyncio.Task[None] | None = None
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
        self._worker = asyncio.get_running_loop().create_task(self._serve())

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            self._reject(400, b'{"error":{"message":"malformed HTTP request","type":"invalid_request_error","param":null,"code":null}}')

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._out.clear()
        self._can_write.set()
        if self._worker is not None:
            self._worker.cancel()
        if self._current is not None:
            self._current.cancel()

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    # ---- httptools callbacks
    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = {}
        self._body = []
        self._body_len = 0
        self._too_large = False

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self._body_len += len(body)
        if self._body_len > self._config.max_body_bytes:
            self._too_large = True
            self._body = []
        elif not self._too_large:
            self._body.append(body)

    def on_message_complete(self) -> None:
        if self._too_large:
            self._reject(413, b'{"error":{"message":"request body too large","type":"invalid_request_error","param":null,"code":"body_too_large"}}')
            return
        path, _, query = self._url.decode("latin-1").partition("?")
        req = Request(method=self._parser.get_method().decode(), path=path, query=query, headers=self._headers,
                      body=b"".join(self._body), keep_alive=self._parser.should_keep_alive())
        try:
            self._queue.put_nowait(req)
        except asyncio.QueueFull:
            self._reject(429, b'{"error":{"message":"too many pipelined requests","type":"invalid_request_error","param":null,"code":null}}')

    # ---- serving
    async def _serve(self) -> None:
        while True:
            req = await self._queue.get()
            resp = Response(self, req.keep_alive)
            self._current = asyncio.get_running_loop().create_task(self._handler(req, resp))
            try:
                await self._current
            except asyncio.CancelledError:
                if self.closed:
                    return
                raise
            except Exception as exc:
                if not resp.done:
                    self._on_error(resp, exc)
            finally:
                self._current = None
            if not req.keep_alive and self._transport is not None:
                self._flush()
                self._transport.close()
                return

    def _reject(self, status: int, body: bytes) -> None:
        if self._transport is None or self.closed:
            return
        Response(self, keep_alive=False).send(status, body)
        self._flush()
        self._transport.close()

    def write(self, data: bytes) -> None:
        if self.closed or self._transport is None:
            return
        out = self._out
        if not out:
            asyncio.get_running_loop().call_soon(self._flush)
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


async def serve(handler: Handler, config: HttpConfig, on_error: Callable[[Response, BaseException], None],
                started: Callable[[int], None] | None = None) -> None:
    """Serve forever; ``started`` gets the bound port (useful with port 0)."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Connection(handler, config, on_error), config.host, config.port,
                                      reuse_address=True, backlog=2048)
    port = server.sockets[0].getsockname()[1]
    if started is not None:
        started(port)
    async with server:
        await server.serve_forever()
