"""A stream's idle timeout: SILENT comes only after one wait on an empty queue lasts the timeout."""

from __future__ import annotations

import asyncio

from services.frontend.idle_watch import SILENT, IdleWatch

TIMEOUT_S = 0.05


async def _get(queue: asyncio.Queue, watch: IdleWatch):
    loop = asyncio.get_running_loop()
    if not queue.empty():
        return queue.get_nowait()
    watch.waiting_since = loop.time()
    try:
        return await queue.get()
    finally:
        watch.waiting_since = None


async def test_a_wait_past_the_timeout_gets_silent() -> None:
    queue: asyncio.Queue = asyncio.Queue()
    watch = IdleWatch(queue, TIMEOUT_S)
    try:
        assert await asyncio.wait_for(_get(queue, watch), 2) is SILENT
    finally:
        watch.cancel()


async def test_replies_inside_the_timeout_never_time_out_however_long_the_stream() -> None:
    queue: asyncio.Queue = asyncio.Queue()
    watch = IdleWatch(queue, TIMEOUT_S)

    async def produce() -> None:
        for i in range(12):  # 12 x 0.02 s: over four timeouts in all, never one between replies
            await asyncio.sleep(TIMEOUT_S * 0.4)
            queue.put_nowait(i)

    producer = asyncio.create_task(produce())
    try:
        assert [await _get(queue, watch) for _ in range(12)] == list(range(12))
    finally:
        watch.cancel()
        await producer


async def test_time_the_reader_spends_elsewhere_does_not_count() -> None:
    queue: asyncio.Queue = asyncio.Queue()
    watch = IdleWatch(queue, TIMEOUT_S)
    try:
        await asyncio.sleep(TIMEOUT_S * 3)  # busy (e.g. a slow client) with nothing to wait for
        asyncio.get_running_loop().call_later(TIMEOUT_S * 0.4, queue.put_nowait, "reply")
        assert await _get(queue, watch) == "reply"
        assert queue.empty()  # and no SILENT queued behind it
        await asyncio.sleep(TIMEOUT_S * 2)
        assert queue.empty()
    finally:
        watch.cancel()


async def test_a_cancelled_watch_puts_nothing() -> None:
    queue: asyncio.Queue = asyncio.Queue()
    watch = IdleWatch(queue, TIMEOUT_S)
    watch.waiting_since = asyncio.get_running_loop().time()
    watch.cancel()
    await asyncio.sleep(TIMEOUT_S * 2)
    assert queue.empty()
