"""Services a frontend runs in its own event loop beside its HTTP server (a router replica: `frontend
--router-inside`), started before it serves and stopped after."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

Hosted = Callable[[asyncio.Event], Awaitable[None]]  # a service's run(ready): sets ready once it serves


async def start_hosted(runs: tuple[Hosted, ...]) -> list[asyncio.Task[None]]:
    """Each as a task, once it said it is ready; one that fails first raises its error here (the rest stopped)."""
    tasks: list[asyncio.Task[None]] = []
    try:
        for run in runs:
            ready = asyncio.Event()
            task = asyncio.get_running_loop().create_task(run(ready))
            tasks.append(task)
            waiter = asyncio.ensure_future(ready.wait())
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if not ready.is_set():
                await task  # its error
                raise RuntimeError("a hosted service stopped before it was ready")
        return tasks
    except BaseException:
        await stop_hosted(tasks)
        raise


async def stop_hosted(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)  # each closes its sockets on the way out


async def serve_beside(serving: Awaitable[None], hosted: list[asyncio.Task[None]]) -> None:
    """Serve until ``serving`` ends; a hosted service that ends first (crashed) ends it too, with its error: the
    process exits and its supervisor starts both again, rather than a frontend routing through a dead replica."""
    if not hosted:
        await serving
        return
    server = asyncio.ensure_future(serving)
    try:
        done, _ = await asyncio.wait({server, *hosted}, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
        if server not in done:
            raise RuntimeError("a service hosted by this frontend stopped")
    finally:
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)
