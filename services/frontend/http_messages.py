"""The HTTP server's request, response and limits (services/frontend/http.py runs the connections).

A response is written whole (``send``) or streamed (``start`` + ``write``... + ``end``). HEAD gets the headers
only; an HTTP/1.0 client gets a close-delimited stream (it has no chunked encoding).
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus
from typing import Protocol

import orjson

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


@dataclass(frozen=True)
class HttpConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    max_body_bytes: int = 8 * 1024 * 1024
    # Request line + headers of one request; more gets 431 and the connection closed.
    max_header_bytes: int = 64 * 1024
    # Requests parsed ahead of the one being answered on one connection; more and the socket is not read.
    max_pipelined: int = 16
    # From a request's first byte to the end of its headers (slowloris), from there to the end of its body, and
    # the wait for the next request on an idle keep-alive connection. A response being written has no limit.
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keepalive_timeout_s: float = 15.0
    # Open connections beyond this are answered 503 and closed at once.
    max_connections: int = 4096
    # SO_REUSEPORT: several frontend processes share one port, the kernel spreading connections over them.
    reuse_port: bool = True


@dataclass(slots=True)
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool
    http10: bool = False


class Connection(Protocol):
    closed: bool

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...


def error_body(message: str, code: str | None = None) -> bytes:
    """OpenAI's error shape, for the errors the HTTP layer answers itself."""
    return orjson.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                   "code": code}})


class Response:
    """Writes one response on a connection: either ``send`` whole, or ``start`` + ``write``... + ``end``."""

    __slots__ = ("_conn", "_head_only", "_http10", "done", "headers", "keep_alive", "started", "status")

    def __init__(self, conn: Connection, keep_alive: bool, head_only: bool = False, http10: bool = False) -> None:
        self._conn = conn
        self.keep_alive = keep_alive
        self._head_only = head_only
        self._http10 = http10
        self.started = False  # headers are out
        self.done = False
        self.status = 0
        # Sent with whatever this response turns out to be (e.g. the client's X-Request-Id echoed).
        self.headers: tuple[tuple[bytes, bytes], ...] = ()

    @property
    def disconnected(self) -> bool:
        return self._conn.closed

    def _head(self, status: int, fixed: bytes, headers: tuple[tuple[bytes, bytes], ...]) -> list[bytes]:
        head = [b"HTTP/1.1 %d %s\r\n%s" % (status, _REASONS.get(status, b""), fixed)]
        for name, value in (*self.headers, *headers):
            head.append(b"%s: %s\r\n" % (name, value))
        if not self.keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        return head

    def send(self, status: int, body: bytes, content_type: bytes = b"application/json",
             headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        head = self._head(status, b"content-type: %s\r\ncontent-length: %d\r\n" % (content_type, len(body)),
                          headers)
        if not self._head_only:
            head.append(body)
        self._conn.write(b"".join(head))
        self.started = self.done = True
        self.status = status

    def start(self, status: int, content_type: bytes, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        if self._http10:
            # No chunked encoding in HTTP/1.0: the body ends when the connection does.
            self.keep_alive = False
            fixed = b"content-type: %s\r\ncache-control: no-cache\r\n" % content_type
        else:
            fixed = b"content-type: %s\r\ntransfer-encoding: chunked\r\ncache-control: no-cache\r\n" % content_type
        self._conn.write(b"".join(self._head(status, fixed, headers)))
        self.started = True
        self.status = status

    async def write(self, chunk: bytes) -> None:
        if chunk and not self._head_only:
            self._conn.write(chunk if self._http10 else b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await self._conn.drain()

    def end(self, last_chunk: bytes = b"") -> None:
        if self._head_only:
            pass
        elif self._http10:
            if last_chunk:
                self._conn.write(last_chunk)
        elif last_chunk:
            self._conn.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(last_chunk), last_chunk))
        else:
            self._conn.write(b"0\r\n\r\n")
        self.done = True
