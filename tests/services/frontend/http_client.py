"""A raw HTTP/1.1 client for the server tests: exact bytes out, responses read as they arrive."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from services.frontend.http import HttpConfig, serve

# Long enough for a loaded CI machine; a test that would hang fails after this instead.
WAIT_S = 10.0


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


@contextlib.asynccontextmanager
async def running(handler, on_error=None, **config):
    """The server on a free loopback port, in this event loop; yields the port."""
    loop = asyncio.get_running_loop()
    port = loop.create_future()
    errors: list[BaseException] = []

    def default_on_error(resp, exc):
        errors.append(exc)
        resp.send(500, b"{}")

    task = loop.create_task(serve(handler, HttpConfig(port=0, **config), on_error or default_on_error,
                                  port.set_result))
    try:
        yield await asyncio.wait_for(port, WAIT_S)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def read_reply(reader: asyncio.StreamReader, head_only: bool = False) -> Reply:
    async def read() -> Reply:
        status_line = await reader.readline()
        if not status_line:
            raise EOFError("connection closed before a response")
        status = int(status_line.split()[1])
        headers: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if head_only or status in (100, 204, 304):
            return Reply(status, headers, b"")
        if "content-length" in headers:
            return Reply(status, headers, await reader.readexactly(int(headers["content-length"])))
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while (size := int((await reader.readline()).strip(), 16)) > 0:
                body += await reader.readexactly(size)
                await reader.readline()
            await reader.readline()
            return Reply(status, headers, body)
        return Reply(status, headers, await reader.read())  # close-delimited

    return await asyncio.wait_for(read(), WAIT_S)


async def closed(reader: asyncio.StreamReader) -> bool:
    """True once the server has closed the connection (whatever it sent before)."""
    async def drain() -> None:
        while await reader.read(65536):
            pass

    try:
        await asyncio.wait_for(drain(), WAIT_S)
    except ConnectionResetError:
        pass
    return True
