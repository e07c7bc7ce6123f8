"""A closed connection is freed by reference counting, not left for the garbage collector's rare full runs.

A slowloris socket lives 10 s (the header timeout): long enough for the collector to move it to its oldest
generation, which it scans only when that generation has grown by a quarter. Each connection left in a cycle
there (parser <-> connection, serve task <-> connection) grew the frontend ~2 MiB per 20 s of hostile load
(bench/frontend_hostile.py: 300 slowloris sockets, 10 oversized-header clients, a 7 MB prompt a second).
"""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest
import uvloop

from services.frontend import http
from services.frontend.http import Request, Response
from tests.services.frontend.http_client import closed, connect, read_reply, running


async def _stream_forever(req: Request, resp: Response) -> None:
    if req.path == "/stream":
        resp.start(200, b"text/event-stream")
        while True:
            await resp.write(b"x")
            await asyncio.sleep(0.005)
    resp.send(200, b"%d" % len(req.body), b"text/plain")


async def _every_way_a_connection_ends(port: int) -> None:
    """Timed out, refused (431, 413), answered and closed by either side, and hung up on mid-stream."""
    reader, writer = await connect(port)  # slowloris: 408 at the header timeout
    writer.write(b"POST /x HTTP/1.1\r\nHost: a\r\nX-Slow: a")
    assert (await read_reply(reader)).status == 408
    writer.close()
    reader, writer = await connect(port)  # mid-headers, the client leaves
    writer.write(b"POST /x HTTP/1.1\r\nHost: a\r\nX-Slow: a")
    await asyncio.sleep(0.05)
    writer.close()
    reader, writer = await connect(port)
    writer.write(b"GET /x HTTP/1.1\r\nHost: a\r\nX-Big: " + b"b" * 100_000)
    assert (await read_reply(reader)).status == 431
    writer.close()
    reader, writer = await connect(port)
    writer.write(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 9000000\r\n\r\n" + b"x" * 10_000)
    assert (await read_reply(reader)).status == 413
    writer.close()
    reader, writer = await connect(port)  # answered, then the server closes
    writer.write(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
    assert (await read_reply(reader)).status == 200
    assert await closed(reader)
    writer.close()
    reader, writer = await connect(port)  # answered, kept alive, then the client closes
    writer.write(b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello")
    assert (await read_reply(reader)).status == 200
    writer.close()
    reader, writer = await connect(port)  # hung up on mid-stream
    writer.write(b"GET /stream HTTP/1.1\r\nHost: a\r\n\r\n")
    await reader.readline()
    writer.transport.abort()


async def _connections_left(opened: list[weakref.ref]) -> int:
    async with running(_stream_forever, header_timeout_s=0.2, max_body_bytes=1_000_000) as port:
        gc.collect()
        gc.disable()
        try:
            await _every_way_a_connection_ends(port)
            # Long enough for 431/413's linger (2 s) to end and every close to reach the server.
            await asyncio.sleep(2.5)
            left = sum(ref() is not None for ref in opened)
        finally:
            gc.enable()
    assert len(opened) == 7
    return left


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_closed_connection_is_freed_without_the_garbage_collector(loop: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[weakref.ref] = []
    made = http._Connection.connection_made

    def connection_made(self, transport) -> None:
        opened.append(weakref.ref(self))
        made(self, transport)

    monkeypatch.setattr(http._Connection, "connection_made", connection_made)
    run = uvloop.run if loop == "uvloop" else asyncio.run
    assert run(_connections_left(opened)) == 0
