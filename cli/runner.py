"""Run one service's coroutine on uvloop until SIGINT/SIGTERM, then let it clean up."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable

import uvloop


def run_service(main: Callable[[], Awaitable[None]]) -> None:
    async def _run() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await main()
        except asyncio.CancelledError:
            pass

    uvloop.run(_run())
