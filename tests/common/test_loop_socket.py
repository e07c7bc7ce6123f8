"""common/loop_socket.py: a ZeroMQ socket driven from the event loop, on real sockets.

The hazard it must survive is libzmq's edge-triggered FD: any operation on the socket, a send included, may take
the signal that a message arrived, after which the FD stays quiet with the message queued."""

from __future__ import annotations

import asyncio
import time

import pytest
import zmq
import zmq.asyncio

from common.loop_socket import LoopSocket


@pytest.fixture()
async def pair():
    ctx = zmq.asyncio.Context()
    server = ctx.socket(zmq.ROUTER)
    server.bind("tcp://127.0.0.1:0")
    client = ctx.socket(zmq.DEALER)
    client.connect(server.getsockopt_string(zmq.LAST_ENDPOINT))
    s, c = LoopSocket(server), LoopSocket(client)
    yield s, c
    s.close()
    c.close()
    ctx.destroy(linger=0)


async def test_a_waiting_receive_is_woken_though_sends_on_its_socket_took_the_fd_signal(pair) -> None:
    s, c = pair
    c.send_nowait(b"hello")
    identity, _ = await asyncio.wait_for(s.recv_multipart(), 2)
    for round_ in range(100):
        waiting = asyncio.ensure_future(s.recv_multipart())
        await asyncio.sleep(0)  # the receive finds nothing and waits on the FD
        c.send_nowait(b"ping %d" % round_)
        time.sleep(0.002)  # the ping reaches the server's queue and signals its FD; the loop does not run meanwhile
        for _ in range(5):  # sends on the server's socket process its commands: they take that signal
            s.send_multipart_nowait((identity, b"noise"))
        frames = await asyncio.wait_for(waiting, 2)
        assert frames == [identity, b"ping %d" % round_]
    received = 0
    while received < 100 * 5:  # and the client got every send
        await asyncio.wait_for(c.recv(), 2)
        received += 1


async def test_an_awaited_send_waits_for_a_peer_and_then_goes() -> None:
    ctx = zmq.asyncio.Context()
    lonely = ctx.socket(zmq.DEALER)
    port = lonely.bind_to_random_port("tcp://127.0.0.1")  # bound, so nothing is connected: sends wait
    lonely.unbind(lonely.getsockopt_string(zmq.LAST_ENDPOINT))
    lonely.close(linger=0)
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.IMMEDIATE, 1)  # no queue before a connection: a send has nowhere to go
    dealer.connect(f"tcp://127.0.0.1:{port}")
    out = LoopSocket(dealer)
    try:
        with pytest.raises(zmq.Again):
            out.send_nowait(b"now")  # no connection yet: nowhere to queue it
        sending = asyncio.ensure_future(out.send(b"later"))
        await asyncio.sleep(0.2)
        assert not sending.done()
        router = ctx.socket(zmq.ROUTER)
        router.bind(f"tcp://127.0.0.1:{port}")
        server = LoopSocket(router)
        try:
            await asyncio.wait_for(sending, 5)
            assert (await asyncio.wait_for(server.recv_multipart(), 5))[1] == b"later"
        finally:
            server.close()
            router.close(linger=0)
    finally:
        out.close()
        dealer.close(linger=0)
        ctx.destroy(linger=0)


async def test_close_wakes_a_waiting_receive_with_cancellation(pair) -> None:
    s, _ = pair
    waiting = asyncio.ensure_future(s.recv_multipart())
    await asyncio.sleep(0.05)
    s.close()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(waiting, 1)


async def test_one_receiver_at_a_time(pair) -> None:
    s, _ = pair
    first = asyncio.ensure_future(s.recv_multipart())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="one receiver"):
        await s.recv_multipart()
    first.cancel()


async def test_a_send_to_a_full_peer_waits_without_spinning() -> None:
    # A mandatory ROUTER says POLLOUT while any peer has room; a send to a full one must wait for the next change
    # of the socket's events, not retry in a loop that never yields (it once grew a list of futures to 12 GB).
    ctx = zmq.asyncio.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.setsockopt(zmq.SNDHWM, 2)
    router.bind("tcp://127.0.0.1:0")
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVHWM, 2)
    dealer.connect(router.getsockopt_string(zmq.LAST_ENDPOINT))
    other = ctx.socket(zmq.DEALER)  # a second peer with room: the router's POLLOUT stays set throughout
    other.connect(router.getsockopt_string(zmq.LAST_ENDPOINT))
    r, d = LoopSocket(router), LoopSocket(dealer)
    try:
        other.send(b"me too")
        d.send_nowait(b"hi")
        identity = b""
        while not identity:
            peer, data = await asyncio.wait_for(r.recv_multipart(), 2)
            identity = peer if data == b"hi" else b""
        sent, settled = 0, 0
        while settled < 5:  # fill the pipe and the kernel's buffers toward the dealer, which does not read
            try:
                r.send_multipart_nowait((identity, b"x" * 262144))
                sent, settled = sent + 1, 0
            except zmq.Again:
                settled += 1
                await asyncio.sleep(0.05)  # libzmq's I/O thread moves what it can into the TCP buffers
        sending = asyncio.ensure_future(r.send_multipart((identity, b"last")))
        ticks = 0
        for _ in range(20):  # the loop keeps turning while the send waits
            await asyncio.sleep(0.01)
            ticks += 1
        assert r.sock.getsockopt(zmq.EVENTS) & zmq.POLLOUT  # room toward the other peer
        assert ticks == 20 and not sending.done() and len(r._send_waiters) <= 1
        got = [await asyncio.wait_for(d.recv(), 2) for _ in range(sent + 1)]  # the dealer reads: room again
        assert got[-1] == b"last" and sending.done()
    finally:
        r.close()
        d.close()
        other.close(linger=0)
        ctx.destroy(linger=0)
