"""A stream's inbox: arrival order, one waiting reader, and joins only where ``coalesce`` allows them."""

from __future__ import annotations

import asyncio

import pytest

from common.protocol import ErrorReply, Tokens
from common.stream_inbox import StreamInbox
from common.tokens_merge import merged


async def test_a_waiting_reader_wakes_on_put_and_order_is_kept() -> None:
    inbox = StreamInbox()
    reader = asyncio.create_task(inbox.get())
    await asyncio.sleep(0)
    assert not reader.done()
    inbox.put_nowait("a")
    inbox.put_nowait("b")
    assert await asyncio.wait_for(reader, 1) == "a"
    assert inbox.get_nowait() == "b"
    assert inbox.empty()
    with pytest.raises(asyncio.QueueEmpty):
        inbox.get_nowait()


async def test_one_reader_at_a_time() -> None:
    inbox = StreamInbox()
    first = asyncio.create_task(inbox.get())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError):
        await inbox.get()
    first.cancel()
    inbox.put_nowait(1)  # the cancelled reader left no waiter behind
    assert await asyncio.wait_for(inbox.get(), 1) == 1


async def test_slices_queued_behind_a_slow_reader_come_up_as_one() -> None:
    inbox = StreamInbox(merged)
    for token_id in (1, 2, 3):
        inbox.put_nowait(Tokens(request_id="r", token_ids=(token_id,)))
    inbox.put_nowait(ErrorReply(request_id="r", code="worker_lost", message="gone"))  # never joined
    inbox.put_nowait(Tokens(request_id="r", token_ids=(4,)))
    assert inbox.qsize() == 3
    assert (await inbox.get()).token_ids == (1, 2, 3)
    assert isinstance(await inbox.get(), ErrorReply)
    assert (await inbox.get()).token_ids == (4,)
    inbox.put_nowait(Tokens(request_id="r", token_ids=(5,)))  # a reader that keeps up gets each slice alone
    assert (await inbox.get()).token_ids == (5,)
