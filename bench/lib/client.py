"""The one HTTP/SSE client of bench/: aiohttp, streaming, the arrival time and token count of every output chunk.

Everything in bench/ that talks to an OpenAI-compatible server (ours, vLLM's, Dynamo's) goes through here:
``Client.stream`` for a streaming completion, ``get`` for /v1/models, /health, /metrics. aiohttp does the
HTTP (its C parser, llhttp): status line, 1xx responses skipped, chunked or content-length framing,
keep-alive connections. This module splits the body into lines (LF, CRLF or CR) and parses the server-sent
events (WHATWG rules: ``data:`` lines of one event joined by newlines, dispatched at a blank line, ``:``
comments and other fields ignored, ``event: error`` is an error), then each event's JSON: text or content
deltas, the finish reason, the usage chunk (``choices: []``) and ``data: [DONE]``.

Why aiohttp and not httpx: the client shares the machine with the server it measures (bench/frontend.py runs
it in-process on 2 cores). Against a local SSE server (tests/bench/fake_server.py in another process), 1,000
16-token streams at concurrency 16: this module 0.15 ms of CPU per request, the same on httpx 0.28 0.8 ms
(1.2 ms through one shared httpx pool, whose connection scan grows with the connections), the raw asyncio
parser it replaced 0.10 ms.

Times: ``sent_s`` is when the request body was written (aiohttp's trace), the origin of every time in
bench/lib/metrics.py; a chunk's time is when its event's closing blank line was read.

Tokens per chunk: when the server sends usage on every chunk (vLLM's ``stream_options.continuous_usage_stats``)
a chunk's tokens are the growth of ``usage.completion_tokens``; otherwise each non-empty text chunk is one
token, and tokens the final usage reports beyond that count as arriving with the last chunk
(``metrics.attribute_tokens``, applied by ``StreamResult.timing``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from bench.lib.metrics import RequestTiming, attribute_tokens


@dataclass(slots=True)
class StreamResult:
    status: int = 0
    error: str = ""
    sent_s: float = 0.0  # perf_counter when the request's last byte was written
    end_s: float = 0.0  # perf_counter at the end of the response
    chunk_times_s: list[float] = field(default_factory=list)  # relative to sent_s
    chunk_tokens: list[int] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str = ""
    done: bool = False  # saw data: [DONE]
    text: str = ""  # the streamed text, every choice's joined
    num_events: int = 0  # every data event, [DONE] included

    @property
    def ok(self) -> bool:
        return not self.error and self.status == 200

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_times_s[0] if self.chunk_times_s else None

    @property
    def e2e_s(self) -> float:
        return self.end_s - self.sent_s

    def timing(self) -> RequestTiming:
        """The request as bench/lib/metrics.py measures it (chunk tokens reconciled with the final usage)."""
        return RequestTiming(ok=self.ok, e2e_s=self.e2e_s, chunk_times_s=list(self.chunk_times_s),
                             chunk_tokens=attribute_tokens(self.chunk_tokens, self.completion_tokens),
                             prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
                             cached_tokens=self.cached_tokens, error=self.error)


def _text_of(choice: dict[str, Any]) -> str:
    text = choice.get("text")
    if text:
        return text
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return delta.get("content") or delta.get("reasoning_content") or ""
    return ""


class SseReader:
    """Feeds a ``StreamResult`` from the lines of an SSE body, one line at a time."""

    def __init__(self, res: StreamResult) -> None:
        self.res = res
        self.data: list[str] = []
        self.event = ""
        self.usage_tokens = 0  # completion tokens accounted for by continuous usage

    def line(self, line: str) -> None:
        if not line:
            self.dispatch()
            return
        name, _, value = line.partition(":")
        if not name:  # a comment (keep-alive)
            return
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            self.data.append(value)
        elif name == "event":
            self.event = value

    def dispatch(self) -> None:
        data, event = "\n".join(self.data), self.event
        had_data = bool(self.data)
        self.data, self.event = [], ""
        if not had_data:
            return
        res = self.res
        now = time.perf_counter()
        res.num_events += 1
        if data.strip() == "[DONE]":
            res.done = True
            return
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            res.error = res.error or f"bad SSE event: {data[:200]!r}"
            return
        if event == "error" or (isinstance(obj, dict) and "error" in obj and not obj.get("choices")):
            res.error = res.error or f"in-band error: {data[:300]!r}"
            return
        if isinstance(obj, dict):
            self.on_chunk(obj, now)

    def on_chunk(self, obj: dict[str, Any], now: float) -> None:
        res = self.res
        text = ""
        choices = obj.get("choices") or ()
        for choice in choices:
            text += _text_of(choice)
            if choice.get("finish_reason"):
                res.finish_reason = str(choice["finish_reason"])
        k = 0
        usage = obj.get("usage")
        if usage:
            res.prompt_tokens = usage.get("prompt_tokens", res.prompt_tokens)
            completion = usage.get("completion_tokens")
            if completion is not None:
                res.completion_tokens = completion
                if choices:  # usage on a content chunk: continuous usage stats
                    k = max(0, completion - self.usage_tokens)
                    self.usage_tokens = completion
            details = usage.get("prompt_tokens_details") or {}
            if details.get("cached_tokens") is not None:
                res.cached_tokens = details["cached_tokens"]
        res.text += text
        if text or k:
            res.chunk_times_s.append(now - res.sent_s)
            res.chunk_tokens.append(k if k else 1)


class Client:
    """Keep-alive connections to one server (aiohttp, no cap: a request never waits for a connection)."""

    def __init__(self, base_url: str, api_key: str = "") -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = {"accept": "text/event-stream", "content-type": "application/json"}
        if api_key:
            self.headers["authorization"] = f"Bearer {api_key}"
        self.session: aiohttp.ClientSession | None = None
        self.opened = 0  # TCP connections opened

    def _session(self) -> aiohttp.ClientSession:
        if self.session is None:  # made on first use: it belongs to the running loop
            trace = aiohttp.TraceConfig()
            trace.on_request_chunk_sent.append(self._on_body_sent)
            trace.on_connection_create_end.append(self._on_connected)
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), headers=self.headers, trace_configs=[trace],
                timeout=aiohttp.ClientTimeout(total=None))
        return self.session

    async def _on_body_sent(self, session, ctx, params) -> None:
        if isinstance(ctx.trace_request_ctx, StreamResult):
            ctx.trace_request_ctx.sent_s = time.perf_counter()

    async def _on_connected(self, session, ctx, params) -> None:
        self.opened += 1

    async def aclose(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None

    async def stream(self, path: str, body: dict[str, Any], timeout_s: float = 300.0,
                     result: StreamResult | None = None) -> StreamResult:
        """POST ``body`` to ``path`` and read its stream into ``result`` (given: filled in place, so a caller
        that cancels still has the chunks so far). Errors are in ``result.error``; cancellation re-raises."""
        res = result if result is not None else StreamResult()
        res.sent_s = time.perf_counter()
        try:
            async with asyncio.timeout(timeout_s):
                await self._stream(path, orjson.dumps(body), res)
        except TimeoutError:
            res.error = res.error or f"timeout after {timeout_s}s"
        except aiohttp.ClientConnectorError as exc:
            res.error = res.error or f"connect failed: {exc}"
        except aiohttp.ClientError as exc:
            res.error = res.error or f"connection lost: {type(exc).__name__} {exc}"
        except asyncio.CancelledError:
            res.error = res.error or "cancelled"
            res.end_s = time.perf_counter()
            raise
        res.end_s = time.perf_counter()
        return res

    async def _stream(self, path: str, content: bytes, res: StreamResult) -> None:
        async with self._session().post(self.base_url + path, data=content, trace_request_ctx=res) as resp:
            res.status = resp.status
            if resp.status != 200:
                body = await resp.read()
                res.error = f"HTTP {resp.status}: {body[:300]!r}"
                return
            reader = SseReader(res)
            pending = b""
            async for data in resp.content.iter_any():
                lines = (pending + data).splitlines(keepends=True)
                # The last line waits for its end; so does a CR that may be the first half of a CRLF.
                pending = lines.pop() if lines and not lines[-1].endswith(b"\n") else b""
                for line in lines:
                    reader.line(line.rstrip(b"\r\n").decode())
            if pending:
                reader.line(pending.rstrip(b"\r\n").decode())
            reader.dispatch()  # an event the server did not end with a blank line
        if not res.done and not res.error:
            res.error = "stream ended without [DONE]"


def get(url: str, api_key: str = "", timeout_s: float = 5.0) -> tuple[int, bytes]:
    """GET ``url``; (status, body), status 0 when it could not be reached. Blocking, also when called from a
    running event loop (it then runs on a thread of its own)."""

    async def one() -> tuple[int, bytes]:
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
                async with session.get(url, headers=headers) as resp:
                    return resp.status, await resp.read()
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return 0, b""

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(one())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, one()).result()
