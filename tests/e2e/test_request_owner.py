"""A worker lets only the frontend that sent a request abort it: two frontends (or a stray peer) that happen to use
the same request id cannot cancel each other's streams."""

from __future__ import annotations

import asyncio

import zmq.asyncio

from tests.harness.graph import Graph
from common.protocol import (
    Abort,
    Generate,
    ListWorkers,
    SamplingParams,
    Tokens,
    WorkerList,
)
from common.transport import Client, new_id


async def _abort_from_another_peer(router: str) -> list[Tokens]:
    ctx = zmq.asyncio.Context()
    clients: list[Client] = []
    try:
        listed = await Client(ctx, router).request(ListWorkers(request_id=new_id("t")), 5.0)
        assert isinstance(listed, WorkerList)
        endpoint = next(w.endpoint for w in listed.workers if w.role in ("decode", "both"))
        owner, stranger = Client(ctx, endpoint), Client(ctx, endpoint)
        clients += [owner, stranger]
        rid = new_id("cmpl")
        stream = owner.open_stream(rid)
        await owner.send(Generate(request_id=rid, token_ids=tuple(range(100, 140)),
                                  sampling=SamplingParams(max_tokens=60, ignore_eos=True)))
        first = await asyncio.wait_for(stream.get(), 10)
        await stranger.send(Abort(request_id=rid))  # same id, another connection
        out = [first]
        while out[-1].finish_reason is None:
            msg = await asyncio.wait_for(stream.get(), 10)
            assert isinstance(msg, Tokens), msg
            out.append(msg)
        return out
    finally:
        for c in clients:
            await c.close()
        ctx.destroy(linger=0)


def test_only_the_requester_can_abort(mock_pd: Graph) -> None:
    out = asyncio.run(_abort_from_another_peer(mock_pd.router))
    assert out[-1].finish_reason == "length"
    assert sum(len(t.token_ids) for t in out) == 60
