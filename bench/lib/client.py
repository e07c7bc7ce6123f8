"""Streaming HTTP/1.1 client for OpenAI-style endpoints that timestamps every output chunk.

Built on the design of bench/loadgen.py (raw asyncio protocol, keep-alive connections, one request at a time
per connection, chunked-transfer parsing) but records, per request, the arrival time and token count of every
SSE event that carries output, and the final usage (prompt, completion and cached tokens).

Tokens per chunk: when the server sends usage on every chunk (vLLM's ``stream_options.continuous_usage_stats``)
a chunk's tokens are the growth of ``usage.completion_tokens``; otherwise each non-empty text chunk is one
token, and tokens the final usage reports beyond that are counted as arriving with the last chunk
(``metrics.attribute_tokens``). Each event's JSON is decoded (a few microseconds), which keeps the parser
indifferent to whitespace and field order across servers.
"""

from __future__ import annotations

import asyncio
import ssl as ssl_module
import time
from dataclasses import dataclass, field
from typing import Any

import orjson


@dataclass(slots=True)
class StreamResult:
    status: int = 0
    error: str = ""
    sent_s: float = 0.0  # perf_counter at send
    end_s: float = 0.0  # perf_counter at the end of the response
    chunk_times_s: list[float] = field(default_factory=list)  # relative to sent_s
    chunk_tokens: list[int] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str = ""
    done: bool = False  # saw data: [DONE]
    num_events: int = 0

    @property
    def ok(self) -> bool:
        return not self.error and self.status == 200


def build_request(host: str, port: int, path: str, body: dict[str, Any] | bytes, api_key: str = "") -> bytes:
    """A whole HTTP/1.1 keep-alive POST (head + JSON body) as one bytes object."""
    if isinstance(body, dict):
        body = orjson.dumps(body)
    auth = f"authorization: Bearer {api_key}\r\n" if api_key else ""
    head = (f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
            f"accept: text/event-stream\r\n{auth}content-length: {len(body)}\r\n\r\n").encode()
    return head + body


def _text_of(choice: dict[str, Any]) -> str:
    text = choice.get("text")
    if text:
        return text
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return delta.get("content") or delta.get("reasoning_content") or ""
    return ""


class StreamConn(asyncio.Protocol):
    """One keep-alive connection answering one streaming request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.sse = bytearray()
        self.fut: asyncio.Future[StreamResult] | None = None
        self.res = StreamResult()
        self.state = 0  # 0 head, 1 chunked, 2 content-length, 3 until close
        self.closed = False
        self._clen = 0
        self._usage_tokens = 0  # completion tokens accounted for by continuous usage

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.state == 3 and self.fut is not None:
            self._finish("" if self.res.done else "stream ended without [DONE]")
        else:
            self._finish(f"connection lost: {exc!r}" if exc else "connection closed by server")

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.closed = True

    def send(self, request: bytes) -> asyncio.Future[StreamResult]:
        assert self.transport is not None and self.fut is None
        self.fut = asyncio.get_running_loop().create_future()
        self.res = StreamResult()
        self.state = 0
        self._usage_tokens = 0
        self.buf.clear()
        self.sse.clear()
        self.transport.write(request)
        self.res.sent_s = time.perf_counter()
        return self.fut

    def _finish(self, error: str = "") -> None:
        fut = self.fut
        if fut is None:
            return
        self.fut = None
        res = self.res
        res.end_s = time.perf_counter()
        if error and not res.error:
            res.error = error
        if not fut.done():
            fut.set_result(res)

    def data_received(self, data: bytes) -> None:
        if self.fut is None:
            return
        buf = self.buf
        buf += data
        if self.state == 0:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buf[:end]).lower()
            try:
                self.res.status = int(head[9:12])
            except ValueError:
                self._finish("bad status line")
                self.close()
                return
            del buf[:end + 4]
            if b"transfer-encoding: chunked" in head:
                self.state = 1
            elif b"content-length:" in head:
                at = head.find(b"content-length:")
                eol = head.find(b"\r\n", at)
                self._clen = int(head[at + 15:eol if eol > 0 else len(head)])
                self.state = 2
            else:
                self.state = 3
        if self.state == 2:
            if len(buf) >= self._clen:
                body = bytes(buf[:self._clen])
                del buf[:self._clen]
                if self.res.status == 200:
                    self._on_payload(body)
                    self._finish("" if self.res.done else "response was not a stream")
                else:
                    self._finish(f"HTTP {self.res.status}: {body[:300]!r}")
            return
        if self.state == 3:
            self._on_payload(bytes(buf))
            buf.clear()
            return
        pos, n = 0, len(buf)
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            try:
                size = int(bytes(buf[pos:eol]).split(b";")[0], 16)
            except ValueError:
                self._finish("bad chunk framing")
                self.close()
                return
            if size == 0:
                if n < eol + 4:
                    break
                del buf[:eol + 4]
                res = self.res
                if res.status != 200:
                    res.error = f"HTTP {res.status}: {bytes(self.sse[:300])!r}"
                elif not res.done and not res.error:
                    res.error = "stream ended without [DONE]"
                self._finish()
                return
            end = eol + 2 + size
            if n < end + 2:
                break
            self._on_payload(buf[eol + 2:end])
            pos = end + 2
        if pos:
            del buf[:pos]

    def _on_payload(self, payload: bytes | bytearray) -> None:
        if self.res.status != 200:
            self.sse += payload  # kept for the error message
            return
        sse = self.sse
        sse += payload.replace(b"\r\n", b"\n") if b"\r" in payload else payload
        start = 0
        res = self.res
        while True:
            end = sse.find(b"\n\n", start)
            if end < 0:
                break
            event = bytes(sse[start:end]).strip()
            start = end + 2
            if not event.startswith(b"data:"):
                continue
            now = time.perf_counter()
            res.num_events += 1
            data = event[5:].strip()
            if data == b"[DONE]":
                res.done = True
                continue
            try:
                obj = orjson.loads(data)
            except orjson.JSONDecodeError:
                res.error = f"bad SSE event: {data[:200]!r}"
                continue
            if not isinstance(obj, dict):
                continue
            if "error" in obj and not obj.get("choices"):
                res.error = f"in-band error: {data[:300]!r}"
                continue
            usage = obj.get("usage")
            text = ""
            for choice in obj.get("choices") or ():
                text += _text_of(choice)
                if choice.get("finish_reason"):
                    res.finish_reason = str(choice["finish_reason"])
            k = 0
            if usage:
                res.prompt_tokens = usage.get("prompt_tokens", res.prompt_tokens)
                completion = usage.get("completion_tokens")
                if completion is not None:
                    res.completion_tokens = completion
                    if obj.get("choices"):  # usage on a content chunk: continuous usage stats
                        k = max(0, completion - self._usage_tokens)
                        self._usage_tokens = completion
                details = usage.get("prompt_tokens_details") or {}
                if details.get("cached_tokens") is not None:
                    res.cached_tokens = details["cached_tokens"]
            if text or k:
                res.chunk_times_s.append(now - res.sent_s)
                res.chunk_tokens.append(k if k else 1)
        if start:
            del sse[:start]


class ConnPool:
    """Keep-alive connections to one server: idle ones are reused, more are opened as needed."""

    def __init__(self, host: str, port: int, use_ssl: bool = False) -> None:
        self.host, self.port = host, port
        self.ssl = ssl_module.create_default_context() if use_ssl else None
        self.idle: list[StreamConn] = []
        self.opened = 0

    async def acquire(self) -> StreamConn:
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                return conn
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(StreamConn, self.host, self.port, ssl=self.ssl,
                                               server_hostname=self.host if self.ssl else None)
        self.opened += 1
        return conn

    def release(self, conn: StreamConn) -> None:
        if not conn.closed:
            self.idle.append(conn)

    def close(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()

    async def request(self, request: bytes, timeout_s: float) -> StreamResult:
        try:
            conn = await self.acquire()
        except OSError as exc:
            now = time.perf_counter()
            return StreamResult(error=f"connect failed: {exc}", sent_s=now, end_s=now)
        try:
            res = await asyncio.wait_for(asyncio.shield(conn.send(request)), timeout_s)
        except asyncio.TimeoutError:
            res = conn.res
            res.error = f"timeout after {timeout_s}s"
            res.end_s = time.perf_counter()
            conn.fut = None
            conn.close()
            return res
        except asyncio.CancelledError:
            conn.fut = None
            conn.close()
            raise
        if res.error and not conn.closed:
            conn.close()  # the connection's state is unknown after an error: do not reuse it
        self.release(conn)
        return res
