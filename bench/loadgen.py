"""A cheap load client for OpenAI-style streaming endpoints: raw asyncio (uvloop) HTTP/1.1 over keep-alive.

One connection per concurrency slot; each slot writes a prebuilt request (headers + body as one bytes object)
and parses the chunked SSE answer minimally: chunk framing, ``data:`` events split on blank lines, the first
content delta (TTFT), the finish reason, the usage event (the only JSON it decodes) and ``[DONE]``. It costs a
small fraction of what the server spends per request, so on a small machine it does not steal the server's
core. Reusable: build requests with ``chat_request``, run them with ``run_load`` (inside a running loop) or
``run_load_sync`` (starts uvloop).

    reqs = [chat_request("127.0.0.1", 8000, body) for body in bodies]
    result = run_load_sync("127.0.0.1", 8000, reqs, concurrency=64, expected_tokens=16)
"""

from __future__ import annotations

import asyncio
import resource
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

_CONTENT = b'"delta":{"content":'
_TEXT = b'"text":'
_FINISH = b'"finish_reason":"'
_USAGE = b'"usage":'
_DONE = b"data: [DONE]"


def chat_request(host: str, port: int, body: bytes | dict[str, Any], path: str = "/v1/chat/completions") -> bytes:
    """A whole HTTP/1.1 keep-alive POST (head + JSON body) as one bytes object."""
    if isinstance(body, dict):
        body = orjson.dumps(body)
    head = (f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
            f"accept: text/event-stream\r\ncontent-length: {len(body)}\r\n\r\n").encode()
    return head + body


@dataclass(slots=True)
class Record:
    """One request's outcome; times are perf_counter seconds relative to its send."""

    status: int = 0
    ttft_s: float = -1.0  # first content delta (or the first data event when there is none)
    e2e_s: float = -1.0
    num_events: int = 0  # every `data:` event, [DONE] included
    num_content: int = 0  # content deltas
    finish_reason: str = ""
    prompt_tokens: int = -1  # from the usage event (needs stream_options.include_usage)
    completion_tokens: int = -1
    done: bool = False  # saw `data: [DONE]` and the chunked terminator
    error: str = ""


class _Conn(asyncio.Protocol):
    """One keep-alive connection that answers one request at a time."""

    __slots__ = ("transport", "buf", "sse", "fut", "rec", "t0", "state", "closed", "_clen")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.sse = bytearray()
        self.fut: asyncio.Future[Record] | None = None
        self.rec = Record()
        self.t0 = 0.0
        self.state = 0  # 0 head, 1 chunked body, 2 content-length body
        self.closed = False
        self._clen = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._finish(f"connection lost: {exc!r}" if exc else "connection closed by server")

    def send(self, request: bytes) -> asyncio.Future[Record]:
        assert self.transport is not None and self.fut is None
        self.fut = asyncio.get_running_loop().create_future()
        self.rec = Record()
        self.state = 0
        self.buf.clear()
        self.sse.clear()
        self.t0 = time.perf_counter()
        self.transport.write(request)
        return self.fut

    def _finish(self, error: str = "") -> None:
        fut = self.fut
        if fut is None:
            return
        self.fut = None
        rec = self.rec
        rec.e2e_s = time.perf_counter() - self.t0
        if error and not rec.error:
            rec.error = error
        if not fut.done():
            fut.set_result(rec)

    def data_received(self, data: bytes) -> None:
        if self.fut is None:
            return  # bytes after a finished answer: ignore (the server does not send any)
        buf = self.buf
        buf += data
        if self.state == 0:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buf[:end]).lower()
            try:
                self.rec.status = int(head[9:12])
            except ValueError:
                self._finish("bad status line")
                self.transport.close()  # type: ignore[union-attr]
                return
            del buf[:end + 4]
            if b"transfer-encoding: chunked" in head:
                self.state = 1
            else:
                at = head.find(b"content-length:")
                eol = head.find(b"\r\n", at)
                self._clen = int(head[at + 15:eol if eol > 0 else len(head)]) if at >= 0 else 0
                self.state = 2
        if self.state == 2:
            if len(buf) >= self._clen:
                body = bytes(buf[:self._clen])
                self._finish("" if self.rec.status == 200 else f"HTTP {self.rec.status}: {body[:200]!r}")
            return
        # chunked: consume whole chunks
        pos = 0
        n = len(buf)
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(buf[pos:eol], 16)
            if size == 0:
                if n < eol + 4:
                    break
                del buf[:eol + 4]
                rec = self.rec
                if rec.status != 200:
                    rec.error = f"HTTP {rec.status}: {bytes(self.sse[:200])!r}"
                elif not rec.done:
                    rec.error = "stream ended without [DONE]"
                self._finish()
                return
            end = eol + 2 + size
            if n < end + 2:
                break
            self._on_payload(buf[eol + 2:end])
            pos = end + 2
        if pos:
            del buf[:pos]

    def _on_payload(self, payload: bytearray) -> None:
        sse = self.sse
        sse += payload
        start = 0
        rec = self.rec
        while True:
            end = sse.find(b"\n\n", start)
            if end < 0:
                break
            event = bytes(sse[start:end])
            start = end + 2
            if not event.startswith(b"data:"):
                continue
            rec.num_events += 1
            if event == _DONE:
                rec.done = True
                continue
            if _CONTENT in event or (_TEXT in event and _FINISH not in event):
                rec.num_content += 1
                if rec.num_content == 1:
                    rec.ttft_s = time.perf_counter() - self.t0
            elif rec.ttft_s < 0 and rec.num_events == 1 and b'"role"' not in event:
                rec.ttft_s = time.perf_counter() - self.t0
            if _FINISH in event:
                at = event.find(_FINISH) + len(_FINISH)
                rec.finish_reason = event[at:event.find(b'"', at)].decode()
            if _USAGE in event:
                try:
                    usage = orjson.loads(event[5:])["usage"]
                    rec.prompt_tokens = usage["prompt_tokens"]
                    rec.completion_tokens = usage["completion_tokens"]
                except (orjson.JSONDecodeError, KeyError, TypeError):
                    rec.error = "bad usage event"
            if b'"error"' in event and b'"choices"' not in event:
                rec.error = f"in-band error: {event[:200]!r}"
        if start:
            del sse[:start]


@dataclass
class LoadResult:
    num_requests: int
    concurrency: int
    wall_s: float
    records: list[Record]
    client_cpu_s: float  # this process's user+sys CPU while the load ran
    num_ok: int = 0
    num_errors: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    def summary(self, expected_tokens: int | None = None) -> dict[str, Any]:
        ok = [r for r in self.records if not r.error]
        ttft = sorted(r.ttft_s for r in ok if r.ttft_s >= 0)
        e2e = sorted(r.e2e_s for r in ok)

        def pct(values: list[float], q: float) -> float | None:
            return round(values[min(len(values) - 1, int(q * len(values)))] * 1e3, 3) if values else None

        prompt = sorted({r.prompt_tokens for r in ok})
        completion = sorted({r.completion_tokens for r in ok})
        content = [r.num_content for r in ok]
        out: dict[str, Any] = {
            "num_requests": self.num_requests, "concurrency": self.concurrency,
            "completed_ok": self.num_ok, "errors": self.num_errors, "error_kinds": self.errors,
            "wall_s": round(self.wall_s, 4),
            "requests_per_s": round(self.num_ok / self.wall_s, 1) if self.wall_s > 0 else 0.0,
            "ttft_ms": {"p50": pct(ttft, 0.5), "p90": pct(ttft, 0.9), "p99": pct(ttft, 0.99),
                        "max": pct(ttft, 1.0)},
            "e2e_ms": {"p50": pct(e2e, 0.5), "p90": pct(e2e, 0.9), "p99": pct(e2e, 0.99), "max": pct(e2e, 1.0)},
            "prompt_tokens_seen": prompt, "completion_tokens_seen": completion,
            "content_chunks": {"min": min(content) if content else None, "max": max(content) if content else None,
                               "mean": round(sum(content) / len(content), 2) if content else None},
            "all_done": all(r.done for r in self.records),
            "client_cpu_s": round(self.client_cpu_s, 4),
            "client_cpu_ms_per_request": round(self.client_cpu_s * 1e3 / max(1, len(self.records)), 4),
        }
        if expected_tokens is not None:
            out["expected_completion_tokens"] = expected_tokens
            out["all_completion_tokens_match"] = all(r.completion_tokens == expected_tokens for r in ok)
            out["content_chunks_le_tokens"] = all(r.num_content <= expected_tokens for r in ok)
        return out


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def run_load(host: str, port: int, requests: list[bytes], concurrency: int,
                   expected_tokens: int | None = None, timeout_s: float = 120.0) -> LoadResult:
    """Send every request in ``requests`` once, ``concurrency`` at a time, one keep-alive connection per slot.

    A record is an error when the status is not 200, the stream lacks [DONE], the usage shows a different
    completion token count than ``expected_tokens``, or the connection drops (the slot then reconnects).
    """
    loop = asyncio.get_running_loop()

    async def connect() -> _Conn:
        _, conn = await loop.create_connection(_Conn, host, port)
        return conn

    conns = [await connect() for _ in range(concurrency)]
    records: list[Record] = [Record() for _ in requests]
    next_index = 0
    num = len(requests)

    async def slot(i: int) -> None:
        nonlocal next_index
        conn = conns[i]
        while next_index < num:
            index = next_index
            next_index += 1
            if conn.closed:
                conn = conns[i] = await connect()
            try:
                rec = await asyncio.wait_for(conn.send(requests[index]), timeout_s)
            except asyncio.TimeoutError:
                rec = Record(error=f"timeout after {timeout_s}s")
                conn.transport.close()  # type: ignore[union-attr]
                conn = conns[i] = await connect()
            if not rec.error and expected_tokens is not None and rec.completion_tokens != expected_tokens:
                rec.error = f"completion_tokens {rec.completion_tokens} != {expected_tokens}"
            records[index] = rec

    cpu0 = _cpu_s()
    t0 = time.perf_counter()
    await asyncio.gather(*(slot(i) for i in range(concurrency)))
    wall = time.perf_counter() - t0
    cpu = _cpu_s() - cpu0
    for conn in conns:
        if conn.transport is not None:
            conn.transport.close()
    result = LoadResult(num_requests=num, concurrency=concurrency, wall_s=wall, records=records, client_cpu_s=cpu)
    for r in records:
        if r.error:
            result.num_errors += 1
            kind = r.error.split(":")[0][:80]
            result.errors[kind] = result.errors.get(kind, 0) + 1
        else:
            result.num_ok += 1
    return result


def run_load_sync(host: str, port: int, requests: list[bytes], concurrency: int,
                  expected_tokens: int | None = None, timeout_s: float = 120.0) -> LoadResult:
    import uvloop

    return uvloop.run(run_load(host, port, requests, concurrency, expected_tokens, timeout_s))
