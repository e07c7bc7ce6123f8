"""The transport's size caps: an oversized frame is dropped, and the connection it came on keeps every stream."""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio

from common.errors import ProtocolError
from common.protocol import GetStats, Tokens
from common.transport import Client, Server, TransportConfig

CAP = 64 * 1024  # a small soft cap keeps the test cheap


async def test_oversized_frame_is_dropped_and_the_connection_keeps_its_streams() -> None:
    ctx = zmq.asyncio.Context()
    config = TransportConfig(max_message_bytes=CAP)
    server = Server(ctx, "tcp://127.0.0.1:0", config)
    client = Client(ctx, server.endpoint, config)
    try:
        stream = client.open_stream("r1")
        await client.send(GetStats(request_id="r1"))
        identity, first = await asyncio.wait_for(server.recv(), 5)
        assert first == GetStats(request_id="r1")
        await server.send(identity, Tokens(request_id="r1", token_ids=(1,)))
        assert (await asyncio.wait_for(stream.get(), 5)).token_ids == (1,)

        # A buggy peer on the same connection sends one frame over the cap, then a good one.
        await client._sock.send(b"\x00" * (4 * CAP))
        await client.send(GetStats(request_id="r2"))
        identity2, second = await asyncio.wait_for(server.recv(), 5)
        assert second == GetStats(request_id="r2")  # the oversized one was dropped, not decoded
        assert identity2 == identity  # same connection: nothing was cut

        # The stream opened before the bad frame still gets what the server sends afterwards.
        await server.send(identity, Tokens(request_id="r1", token_ids=(2,), finish_reason="stop"))
        assert (await asyncio.wait_for(stream.get(), 5)).token_ids == (2,)
    finally:
        await client.close()
        server.close()
        ctx.term()


async def test_a_message_over_the_cap_is_refused_before_it_is_sent() -> None:
    ctx = zmq.asyncio.Context()
    config = TransportConfig(max_message_bytes=CAP)
    server = Server(ctx, "tcp://127.0.0.1:0", config)
    client = Client(ctx, server.endpoint, config)
    try:
        with pytest.raises(ProtocolError, match="over the"):
            await client.send(Tokens(request_id="big", token_ids=tuple(range(CAP))))
        await client.send(GetStats(request_id="ok"))
        _, msg = await asyncio.wait_for(server.recv(), 5)
        assert msg == GetStats(request_id="ok")
    finally:
        await client.close()
        server.close()
        ctx.term()


def test_request_ids_are_random_not_pid_and_counter() -> None:
    from common.transport import new_id

    ids = {new_id("cmpl") for _ in range(10_000)}
    assert len(ids) == 10_000
    one = next(iter(ids))
    prefix, suffix = one.split("-")
    assert prefix == "cmpl" and len(suffix) == 24 and int(suffix, 16) >= 0  # 96 bits, hex


def _fill(client: Client, request_id: str) -> None:
    """send_nowait toward a peer that never reads (nothing bound there) until the queue to it is full."""
    for i in range(10_000):
        client.send_nowait(GetStats(request_id=f"{request_id}-{i}" if i else request_id))


async def test_send_nowait_failures_surface_at_once_failing_the_stream_or_raising() -> None:
    from cli.launcher import free_port
    from common.protocol import ErrorReply

    ctx = zmq.asyncio.Context()
    # Nobody listens there: libzmq queues for the connection it keeps trying, up to the high-water mark.
    client = Client(ctx, f"tcp://127.0.0.1:{free_port()}", TransportConfig(hwm=4))
    try:
        # No stream: the failure is raised to the caller (before: a future nobody read, and silence).
        with pytest.raises(zmq.Again):
            _fill(client, "plain")
        assert client.num_send_failures == 1
        # A stream open for the request: it gets worker_lost now, so the frontend fails it over at once instead
        # of waiting out its idle timeout; the send itself does not raise.
        stream = client.open_stream("r1")
        client.send_nowait(GetStats(request_id="r1"))
        reply = stream.get_nowait()
        assert isinstance(reply, ErrorReply) and reply.code == "worker_lost" and client.endpoint in reply.message
        assert client.num_send_failures == 2
    finally:
        await client.close()
        ctx.destroy(linger=0)
