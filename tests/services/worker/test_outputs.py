"""The forwarder between an engine and its frontend's outbox: taken in the step while the frontend keeps up,
yielded to the request's task (which waits for room) once it does not."""

from __future__ import annotations

import asyncio

from common.protocol import Tokens
from services.worker.engine import EngineOutput
from services.worker.outputs import OutputForwarder


class _Outbox:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, Tokens]] = []
        self.is_full = False
        self.room_event = asyncio.Event()

    def full(self, identity: bytes) -> bool:
        return self.is_full

    async def room(self, identity: bytes) -> None:
        await self.room_event.wait()

    def put(self, identity: bytes, msg: Tokens) -> None:
        self.sent.append((identity, msg))


async def test_takes_while_there_is_room_then_declines_and_put_waits_for_room() -> None:
    outbox, seen = _Outbox(), []
    fwd = OutputForwarder(b"fe", outbox, seen.append)  # type: ignore[arg-type]
    first = EngineOutput("r", (5,), num_prompt_tokens=3, num_cached_tokens=2)
    assert fwd.take(first)
    assert outbox.sent == [(b"fe", Tokens(request_id="r", token_ids=(5,), num_prompt_tokens=3, num_cached_tokens=2))]

    outbox.is_full = True
    last = EngineOutput("r", (6, 7), finish_reason="length", num_prompt_tokens=3, num_cached_tokens=2)
    assert not fwd.take(last) and len(outbox.sent) == 1  # declined: nothing sent, nothing counted
    put = asyncio.create_task(fwd.put(last))
    await asyncio.sleep(0.01)
    assert not put.done()
    outbox.room_event.set()
    await put
    assert [m.token_ids for _, m in outbox.sent] == [(5,), (6, 7)] and outbox.sent[1][1].finish_reason == "length"
    assert seen == [first, last]
    assert (fwd.num_output_tokens, fwd.num_cached_tokens, fwd.finish_reason) == (3, 2, "length")
