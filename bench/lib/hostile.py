"""Hostile HTTP clients for bench/frontend_hostile.py: slowloris sockets, oversized headers, oversized prompts.

Run as a process of its own (so its CPU and its event loop never stall the normal streams' client), for a fixed
time, writing what the server answered to a JSON file:

    python -m bench.lib.hostile --port 8000 --model tiny --duration-s 30 --out hostile.json

- **slowloris**: ``num_slowloris`` sockets, each sends a request line, then one header byte every
  ``slow_interval_s`` and never ends its headers. When the server closes one, it notes the seconds it stayed
  open and the status it got (408 expected), and opens another: the count stays at ``num_slowloris``.
- **big headers**: ``num_big_header`` clients, each opens a connection and writes ``big_header_bytes`` of
  header lines as fast as the socket takes them, then reads the answer (431 expected); again after a pause.
- **big prompt**: every ``prompt_interval_s`` a chat completion whose one user message is ``prompt_bytes``
  long (400 expected: over the context, or 413 over the body cap).

Raw asyncio streams, no HTTP library: the 300 slow sockets cost one timer wake-up every few seconds each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson


@dataclass
class HostileConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    model: str = "tiny"
    duration_s: float = 30.0
    num_slowloris: int = 300
    slow_interval_s: float = 2.0
    num_big_header: int = 10
    big_header_bytes: int = 30 * 1024 * 1024
    big_header_pause_s: float = 1.0
    prompt_bytes: int = 7_000_000
    prompt_interval_s: float = 1.0


@dataclass
class HostileStats:
    slowloris_opened: int = 0
    slowloris_closed_by_server: int = 0
    slowloris_open_s: list[float] = field(default_factory=list)  # connect to server close, per closed socket
    slowloris_statuses: dict[str, int] = field(default_factory=dict)
    big_header_attempts: int = 0
    big_header_statuses: dict[str, int] = field(default_factory=dict)
    big_header_sent_bytes: list[int] = field(default_factory=list)  # header bytes written before it was refused
    big_header_answer_s: list[float] = field(default_factory=list)  # first byte written to the status line
    big_prompt_sent: int = 0
    big_prompt_statuses: dict[str, int] = field(default_factory=dict)
    big_prompt_latency_s: list[float] = field(default_factory=list)  # first byte written to the status line


def _count(counts: dict[str, int], status: int | None) -> None:
    key = str(status) if status is not None else "none"
    counts[key] = counts.get(key, 0) + 1


def status_of(data: bytes) -> int | None:
    """The status code of a response that starts ``data`` (``HTTP/1.1 431 ...``); None if there is none."""
    if not data.startswith(b"HTTP/"):
        return None
    parts = data.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


async def _read_status(reader: asyncio.StreamReader, timeout_s: float) -> int | None:
    try:
        async with asyncio.timeout(timeout_s):
            line = await reader.readline()
    except (TimeoutError, ConnectionError, OSError):
        return None
    return status_of(line)


def _close(writer: asyncio.StreamWriter) -> None:
    try:
        writer.close()
    except (ConnectionError, OSError, RuntimeError):
        pass


async def slowloris(cfg: HostileConfig, stats: HostileStats, index: int, stop_s: float) -> None:
    """One slow socket at a time, replaced whenever the server closes it."""
    await asyncio.sleep(index * cfg.slow_interval_s / max(1, cfg.num_slowloris))  # spread the wake-ups
    while time.monotonic() < stop_s:
        try:
            reader, writer = await asyncio.open_connection(cfg.host, cfg.port)
        except OSError:
            await asyncio.sleep(cfg.slow_interval_s)
            continue
        stats.slowloris_opened += 1
        opened_s = time.monotonic()
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nX-Slow-%d: " % index)
        received = b""
        try:
            while time.monotonic() < stop_s:
                try:
                    async with asyncio.timeout(cfg.slow_interval_s):
                        data = await reader.read(4096)
                except TimeoutError:
                    writer.write(b"a")  # one more byte of a header that never ends
                    continue
                received += data
                if not data:  # the server closed it
                    break
        except (ConnectionError, OSError):
            pass
        else:
            if time.monotonic() >= stop_s:
                _close(writer)
                return
        stats.slowloris_closed_by_server += 1
        stats.slowloris_open_s.append(round(time.monotonic() - opened_s, 3))
        _count(stats.slowloris_statuses, status_of(received))
        _close(writer)


async def big_header(cfg: HostileConfig, stats: HostileStats, stop_s: float) -> None:
    """Writes ``big_header_bytes`` of headers per connection until the server refuses; repeats."""
    line = b"X-Big: " + b"b" * 8000 + b"\r\n"
    chunk = line * 8  # ~64 KiB a write
    while time.monotonic() < stop_s:
        try:
            reader, writer = await asyncio.open_connection(cfg.host, cfg.port)
        except OSError:
            await asyncio.sleep(cfg.big_header_pause_s)
            continue
        stats.big_header_attempts += 1
        start_s = time.monotonic()
        status_task = asyncio.create_task(_read_status(reader, 30.0))
        sent = 0
        try:
            writer.write(b"GET /health HTTP/1.1\r\nHost: bench\r\n")
            while sent < cfg.big_header_bytes:  # an attacker does not stop at the answer
                writer.write(chunk)
                sent += len(chunk)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        status = await status_task
        stats.big_header_answer_s.append(round(time.monotonic() - start_s, 3))
        stats.big_header_sent_bytes.append(sent)
        _count(stats.big_header_statuses, status)
        _close(writer)
        await asyncio.sleep(cfg.big_header_pause_s)


def big_prompt_body(model: str, num_bytes: int) -> bytes:
    """A chat completion request whose user message is ``num_bytes`` of ordinary words."""
    words = b"the quick brown fox jumps over a lazy dog "
    text = (words * (num_bytes // len(words) + 1))[:num_bytes].decode()
    return orjson.dumps({"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 16,
                         "stream": True})


async def big_prompt(cfg: HostileConfig, stats: HostileStats, body: bytes) -> None:
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body))
    try:
        reader, writer = await asyncio.open_connection(cfg.host, cfg.port)
    except OSError:
        _count(stats.big_prompt_statuses, None)
        return
    stats.big_prompt_sent += 1
    start_s = time.monotonic()
    status_task = asyncio.create_task(_read_status(reader, 60.0))
    try:
        writer.write(head)
        view = memoryview(body)
        for offset in range(0, len(body), 1 << 20):
            writer.write(view[offset:offset + (1 << 20)])
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    status = await status_task
    stats.big_prompt_latency_s.append(round(time.monotonic() - start_s, 3))
    _count(stats.big_prompt_statuses, status)
    _close(writer)


async def run(cfg: HostileConfig) -> HostileStats:
    """Every hostile client for ``duration_s``, then all stopped at once (their sockets closed with the
    process); answers still owed then are not counted."""
    stats = HostileStats()
    stop_s = time.monotonic() + cfg.duration_s
    body = big_prompt_body(cfg.model, cfg.prompt_bytes)
    tasks = [asyncio.create_task(slowloris(cfg, stats, i, stop_s)) for i in range(cfg.num_slowloris)]
    tasks += [asyncio.create_task(big_header(cfg, stats, stop_s)) for _ in range(cfg.num_big_header)]
    while (now := time.monotonic()) < stop_s:
        tasks.append(asyncio.create_task(big_prompt(cfg, stats, body)))
        await asyncio.sleep(min(cfg.prompt_interval_s, stop_s - now))
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, value in asdict(HostileConfig()).items():
        ap.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    ap.add_argument("--out", type=Path, required=True)
    args = vars(ap.parse_args())
    out = args.pop("out")
    import uvloop

    stats = uvloop.run(run(HostileConfig(**args)))
    out.write_text(json.dumps(asdict(stats)))


if __name__ == "__main__":
    main()
