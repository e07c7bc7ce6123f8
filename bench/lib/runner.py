"""Drives one load point: closed loop (fixed concurrency) or open loop (Poisson or trace arrivals).

- Closed loop: ``concurrency`` slots; each takes the next session and sends its turns one after the other
  (waiting each turn's think time), then takes the next session. With one-turn sessions this is the classic
  "N requests in flight at all times".
- Open loop: sessions start at their arrival times (Poisson of ``rate`` per second, or the trace's
  timestamps), whether or not earlier ones finished; ``max_concurrency`` optionally caps requests in flight.

Bounds: at most the workload's requests; no request is *sent* after ``max_duration_s`` (those in flight finish,
each bounded by ``timeout_s``).
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import orjson

from bench.lib.client import Client, StreamResult
from bench.lib.metrics import RequestTiming, token_times
from bench.lib.server import Target
from bench.lib.workloads import Session, Turn, chat_messages


@dataclass
class RequestParams:
    model: str
    endpoint: str = "completions"  # completions | chat
    ignore_eos: bool = True
    continuous_usage: bool = True
    temperature: float | None = 0.0
    extra_body: dict[str, Any] = field(default_factory=dict)


@dataclass
class Sent:
    """One request as sent and answered."""

    session: int
    turn: int
    isl: int
    osl: int
    start_s: float  # send time relative to the point's start
    result: StreamResult

    def timing(self) -> RequestTiming:
        return self.result.timing()


@dataclass
class PointRun:
    sent: list[Sent]
    duration_s: float  # first send to last response end
    wall_s: float  # start of the point to its end
    connections_opened: int
    stopped_by_duration: bool


def request_body(turn: Turn, p: RequestParams) -> dict[str, Any]:
    body: dict[str, Any] = {"model": p.model, "max_tokens": turn.osl, "stream": True,
                            "stream_options": {"include_usage": True}}
    if p.continuous_usage:
        body["stream_options"]["continuous_usage_stats"] = True
    if p.ignore_eos:
        body["ignore_eos"] = True
        body["min_tokens"] = turn.osl
    if p.temperature is not None:
        body["temperature"] = p.temperature
    if p.endpoint == "chat":
        body["messages"] = chat_messages(turn)
    else:
        body["prompt"] = turn.tokens
    body.update(p.extra_body)
    return body


class Progress:
    """One stderr line, rewritten in place (\\r) on a terminal, a line every few seconds otherwise."""

    def __init__(self, label: str, total: int, enabled: bool = True) -> None:
        self.label, self.total, self.enabled = label, total, enabled
        self.done = self.errors = self.inflight = 0
        self.t0 = time.perf_counter()
        self.tty = sys.stderr.isatty()
        self._last = self.t0

    def line(self) -> str:
        el = time.perf_counter() - self.t0
        rate = self.done / el if el > 0 else 0.0
        width = 24
        fill = int(width * self.done / self.total) if self.total else width
        return (f"{self.label} [{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} "
                f"err {self.errors} inflight {self.inflight} {rate:.1f} req/s {el:.1f}s")

    def update(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if not force and now - self._last < (0.25 if self.tty else 5.0):
            return
        self._last = now
        sys.stderr.write(("\r" + self.line() + "\x1b[K") if self.tty else self.line() + "\n")
        sys.stderr.flush()

    def finish(self) -> None:
        if self.enabled:
            self.update(force=True)
            if self.tty:
                sys.stderr.write("\n")
            sys.stderr.flush()


async def run_point(target: Target, sessions: list[Session], params: RequestParams, *,
                    concurrency: int | None = None, arrivals_s: list[float] | None = None,
                    max_concurrency: int | None = None, max_duration_s: float = 600.0, timeout_s: float = 300.0,
                    progress: Progress | None = None,
                    on_sent: Callable[[Sent], None] | None = None) -> PointRun:
    """Closed loop when ``concurrency`` is given, else open loop with ``arrivals_s`` (one per session)."""
    if (concurrency is None) == (arrivals_s is None):
        raise ValueError("give exactly one of concurrency and arrivals_s")
    client = Client(target.url, target.api_key)
    path = "/v1/chat/completions" if params.endpoint == "chat" else "/v1/completions"  # under target.url
    sent: list[Sent] = []
    t0 = time.perf_counter()
    deadline = t0 + max_duration_s
    stopped = False
    cap = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    prog = progress

    async def send(si: int, ti: int, turn: Turn) -> bool:
        nonlocal stopped
        if time.perf_counter() >= deadline:
            stopped = True
            return False
        body = request_body(turn, params)
        if prog:
            prog.inflight += 1
        start = time.perf_counter() - t0
        if cap is not None:
            async with cap:
                res = await client.stream(path, body, timeout_s)
        else:
            res = await client.stream(path, body, timeout_s)
        item = Sent(si, ti, turn.isl, turn.osl, start, res)
        sent.append(item)
        if prog:
            prog.inflight -= 1
            prog.done += 1
            prog.errors += not res.ok
            prog.update()
        if on_sent:
            on_sent(item)
        return True

    async def run_session(si: int, session: Session) -> None:
        for ti, turn in enumerate(session.turns):
            if ti and turn.think_s > 0:
                if time.perf_counter() + turn.think_s >= deadline:
                    return
                await asyncio.sleep(turn.think_s)
            if not await send(si, ti, turn):
                return

    ticker_stop = asyncio.Event()

    async def ticker() -> None:
        while not ticker_stop.is_set():
            if prog:
                prog.update()
            try:
                await asyncio.wait_for(ticker_stop.wait(), 0.5)
            except asyncio.TimeoutError:
                pass

    tick = asyncio.create_task(ticker())
    try:
        if concurrency is not None:
            it = iter(enumerate(sessions))

            async def slot() -> None:
                for si, session in it:
                    if time.perf_counter() >= deadline:
                        return
                    await run_session(si, session)

            await asyncio.gather(*(slot() for _ in range(concurrency)))
        else:
            tasks = []
            for si, (session, at) in enumerate(zip(sessions, arrivals_s or [])):
                delay = t0 + at - time.perf_counter()
                if t0 + at >= deadline:
                    stopped = True
                    break
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(run_session(si, session)))
            await asyncio.gather(*tasks)
    finally:
        ticker_stop.set()
        await tick
        await client.aclose()
        if prog:
            prog.finish()
    wall = time.perf_counter() - t0
    if sent:
        first = min(s.result.sent_s for s in sent)
        last = max(s.result.end_s for s in sent)
        duration = last - first
    else:
        duration = 0.0
    sent.sort(key=lambda s: (s.start_s, s.session, s.turn))
    return PointRun(sent, duration, wall, client.opened, stopped)


def request_rows(run: PointRun) -> list[dict[str, Any]]:
    """Per-request facts for the point's JSON (no per-token gaps: the plots and summaries have those)."""
    rows = []
    for s in run.sent:
        t = s.timing()
        gaps = t.itl_s()
        tp = t.tpot_s()
        rows.append({
            "session": s.session, "turn": s.turn, "start_s": round(s.start_s, 6), "ok": t.ok,
            "error": t.error or None, "isl": s.isl, "osl": s.osl,
            "prompt_tokens": t.prompt_tokens, "output_tokens": t.num_output_tokens, "cached_tokens": t.cached_tokens,
            "num_chunks": len(t.chunk_times_s),
            "ttft_ms": None if t.ttft_s is None else round(t.ttft_s * 1e3, 4),
            "tpot_ms": None if tp is None else round(tp * 1e3, 4),
            "itl_max_ms": round(max(gaps) * 1e3, 4) if gaps else None,
            # When the longest gap ended, from the request's send: with start_s, where a stall falls in the run.
            "itl_max_at_ms": (round(token_times(t.chunk_times_s, t.chunk_tokens)[gaps.index(max(gaps)) + 1] * 1e3, 4)
                              if gaps else None),
            "e2e_ms": round(t.e2e_s * 1e3, 4), "finish_reason": s.result.finish_reason or None,
        })
    return rows


def dumps(doc: Any) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY) + b"\n"
