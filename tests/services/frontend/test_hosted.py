"""Services a frontend hosts (its router replica) start before it serves, and a crashed one ends the frontend."""

from __future__ import annotations

import asyncio

import pytest

from services.frontend.hosted import serve_beside, start_hosted, stop_hosted


async def _serves(ready: asyncio.Event) -> None:
    ready.set()
    await asyncio.Event().wait()  # until cancelled


async def _fails_at_start(ready: asyncio.Event) -> None:
    raise OSError("address in use")


async def test_started_once_ready_and_stopped() -> None:
    tasks = await start_hosted((_serves,))
    assert not tasks[0].done()
    await stop_hosted(tasks)
    assert tasks[0].cancelled()


async def test_a_service_failing_before_ready_fails_the_start_and_stops_the_others() -> None:
    started: list[asyncio.Task[None]] = []

    async def first(ready: asyncio.Event) -> None:
        started.append(asyncio.current_task())
        await _serves(ready)

    with pytest.raises(OSError, match="address in use"):
        await start_hosted((first, _fails_at_start))
    assert started[0].cancelled()


async def test_a_hosted_service_that_crashes_ends_serving() -> None:
    serving = asyncio.Event()

    async def server() -> None:
        serving.set()
        await asyncio.Event().wait()

    async def crashes(ready: asyncio.Event) -> None:
        ready.set()
        await serving.wait()
        raise RuntimeError("replica died")

    tasks = await start_hosted((crashes,))
    with pytest.raises(RuntimeError, match="replica died"):
        await asyncio.wait_for(serve_beside(server(), tasks), 5)


async def test_without_hosted_services_it_just_serves() -> None:
    async def server() -> None:
        return None

    await serve_beside(server(), [])
