"""The worker's outbox: one loop turn's Tokens for a peer go as one frame, in order, and nothing is lost."""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio

from common.outbox import PeerOutbox, frames, unbatch
from common.protocol import ErrorReply, GetStats, Message, Tokens, TokensBatch, decode, encode
from common.transport import Client, Server, TransportConfig


def _t(rid: str, token: int, finish: str | None = None) -> Tokens:
    return Tokens(request_id=rid, token_ids=(token,), finish_reason=finish)  # type: ignore[arg-type]


ERR = ErrorReply(request_id="b", code="engine_error", message="x")


@pytest.mark.parametrize(("msgs", "expected"), [
    ([], []),
    ([_t("a", 1)], [_t("a", 1)]),  # a lone Tokens stays as it is
    ([_t("a", 1), _t("b", 2)], [TokensBatch(items=(_t("a", 1), _t("b", 2)))]),
    # Other messages split the runs and keep their place.
    ([_t("a", 1), _t("b", 2), ERR, _t("a", 3)], [TokensBatch(items=(_t("a", 1), _t("b", 2))), ERR, _t("a", 3)]),
    ([ERR, ERR], [ERR, ERR]),
])
def test_frames(msgs: list[Message], expected: list[Message]) -> None:
    assert frames(msgs) == expected
    assert unbatch(frames(msgs)) == msgs


def test_a_long_run_is_cut_into_bounded_batches() -> None:
    out = frames([_t("a", i) for i in range(600)])
    assert [len(f.items) for f in out] == [256, 256, 88]  # type: ignore[union-attr]
    assert [t.token_ids[0] for t in unbatch(out)] == list(range(600))


async def _pair(config: TransportConfig = TransportConfig()):
    ctx = zmq.asyncio.Context()
    server = Server(ctx, "tcp://127.0.0.1:0", config, mandatory=True)
    client = Client(ctx, server.endpoint, config)
    stream = client.open_stream("hello")
    await client.send(GetStats(request_id="hello"))
    identity, _ = await asyncio.wait_for(server.recv(), 5)
    client.close_stream("hello")
    return ctx, server, client, identity


async def test_one_turn_goes_as_one_frame_and_the_client_sees_each_message_in_order() -> None:
    ctx, server, client, identity = await _pair()
    undelivered: list = []
    outbox = PeerOutbox(server, lambda *a: undelivered.append(a))
    try:
        streams = {rid: client.open_stream(rid) for rid in ("a", "b")}
        for msg in (_t("a", 1), _t("b", 2), _t("a", 3, "length"), ErrorReply(request_id="b", code="c", message="m")):
            outbox.put(identity, msg)
        got_a = [await asyncio.wait_for(streams["a"].get(), 5) for _ in range(2)]
        got_b = [await asyncio.wait_for(streams["b"].get(), 5) for _ in range(2)]
        assert [m.token_ids for m in got_a] == [(1,), (3,)] and got_a[1].finish_reason == "length"
        assert got_b[0] == _t("b", 2) and isinstance(got_b[1], ErrorReply)
        assert undelivered == []
    finally:
        await client.close()
        server.close()
        ctx.term()


async def test_the_wire_carries_a_batch() -> None:
    ctx = zmq.asyncio.Context()
    server = Server(ctx, "tcp://127.0.0.1:0", TransportConfig(), mandatory=True)
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(server.endpoint)
    try:
        await dealer.send(encode(GetStats(request_id="x")))
        identity, _ = await asyncio.wait_for(server.recv(), 5)
        outbox = PeerOutbox(server, lambda *a: None)
        outbox.put(identity, _t("a", 1))
        outbox.put(identity, _t("b", 2))
        frame = decode(await asyncio.wait_for(dealer.recv(), 5))
        assert frame == TokensBatch(items=(_t("a", 1), _t("b", 2)))
    finally:
        dealer.close(linger=0)
        server.close()
        ctx.term()


async def test_a_gone_peer_hands_every_message_back() -> None:
    ctx = zmq.asyncio.Context()
    server = Server(ctx, "tcp://127.0.0.1:0", TransportConfig(), mandatory=True)
    undelivered: list = []
    outbox = PeerOutbox(server, lambda *a: undelivered.append(a))
    try:
        msgs = [_t("a", 1), ERR, _t("a", 2)]
        for msg in msgs:
            outbox.put(b"nobody", msg)
        outbox.flush()
        assert undelivered == [(b"nobody", msgs, True)]
    finally:
        server.close()
        ctx.term()


async def test_a_batch_over_the_cap_goes_as_its_items() -> None:
    cap = 4096
    ctx, server, client, identity = await _pair(TransportConfig(max_message_bytes=cap))
    undelivered: list = []
    outbox = PeerOutbox(server, lambda *a: undelivered.append(a))
    try:
        stream = client.open_stream("a")
        big = [Tokens(request_id="a", token_ids=tuple(range(i * 300, i * 300 + 300))) for i in range(4)]
        for msg in big:  # ~1 KB each, ~4 KB+ together
            outbox.put(identity, msg)
        got = [await asyncio.wait_for(stream.get(), 5) for _ in big]
        assert got == big and undelivered == []
    finally:
        await client.close()
        server.close()
        ctx.term()


async def _stalled_peer(limits):
    """A worker-side outbox and a raw "frontend" DEALER that sent one request and then reads nothing."""
    from common.outbox import OutboxLimits  # noqa: F401  (limits is one)

    ctx = zmq.asyncio.Context()
    config = TransportConfig(hwm=4)
    server = Server(ctx, "tcp://127.0.0.1:0", config, mandatory=True)
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVHWM, 4)
    dealer.connect(server.endpoint)
    await dealer.send(encode(GetStats(request_id="x")))
    identity, _ = await asyncio.wait_for(server.recv(), 5)
    outbox = PeerOutbox(server, lambda *a: None, limits)
    return ctx, server, dealer, identity, outbox


BIG = tuple(range(2000))  # ~6 KB a message: the sockets' and kernel's buffers fill in a few thousand


async def _produce(outbox: PeerOutbox, identity: bytes, rid: str, limit: int = 50_000) -> int:
    """What a worker's request loop does: wait for room, put a token message; the number put."""
    for n in range(limit):
        await outbox.room(identity)
        outbox.put(identity, Tokens(request_id=rid, token_ids=BIG))
        await asyncio.sleep(0)  # the loop turn ends: the outbox flushes
    return limit


async def test_a_peer_that_stops_reading_pauses_its_producer_then_stalls_it_with_a_bounded_backlog() -> None:
    from common.outbox import OutboxLimits, PeerStalled

    limits = OutboxLimits(max_messages=64, max_bytes=256 * 1024, stall_timeout_s=0.5)
    ctx, server, dealer, identity, outbox = await _stalled_peer(limits)
    try:
        with pytest.raises(PeerStalled):
            await _produce(outbox, identity, "a")  # never returns: the peer never reads
        num_msgs, num_bytes = outbox.backlog(identity)
        # Held no further than a limit (one message over at most: it is counted once put).
        assert num_msgs <= limits.max_messages and num_bytes <= limits.max_bytes + len(encode(
            Tokens(request_id="a", token_ids=BIG)))
        assert num_msgs > 0 and outbox.num_stalled == 1
        # The request is aborted: its queued tokens leave the backlog.
        assert outbox.drop(identity, "a") == num_msgs and outbox.backlog(identity) == (0, 0)
    finally:
        dealer.close(linger=0)
        server.close()
        ctx.destroy(linger=0)


async def test_a_slow_peer_that_reads_again_gets_everything_in_order() -> None:
    from common.outbox import OutboxLimits

    limits = OutboxLimits(max_messages=64, max_bytes=256 * 1024, stall_timeout_s=30.0)
    ctx, server, dealer, identity, outbox = await _stalled_peer(limits)
    total = 3000
    try:
        producer = asyncio.get_running_loop().create_task(_produce(outbox, identity, "a", total))
        # The producer fills the pipe and waits for room: the backlog reaches its limit, no further.
        def full() -> bool:
            num_msgs, num_bytes = outbox.backlog(identity)
            return num_msgs >= limits.max_messages or num_bytes >= limits.max_bytes

        for _ in range(2000):
            await asyncio.sleep(0.005)
            if full():
                break
        assert full() and not producer.done()
        await asyncio.sleep(0.2)
        assert full() and outbox.backlog(identity)[0] <= limits.max_messages, "the producer waited for room"
        received = []
        while len(received) < total:  # the frontend reads again
            frame = decode(await asyncio.wait_for(dealer.recv(), 10))
            received += unbatch([frame])
        assert await asyncio.wait_for(producer, 10) == total
        assert all(m.token_ids == BIG for m in received) and len(received) == total
    finally:
        dealer.close(linger=0)
        server.close()
        ctx.destroy(linger=0)
