"""Run one service's coroutine on uvloop until SIGINT/SIGTERM, then let it clean up.

With ``on_term`` (workers: drain), the first SIGTERM calls it and the coroutine ends by itself; a second
SIGTERM, or SIGINT, cancels at once. That is what systemd, Kubernetes and ``docker stop`` expect of a
graceful stop; the launcher stops a whole graph with SIGINT.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable

import uvloop


def run_service(main: Callable[[], Awaitable[None]], on_term: Callable[[], None] | None = None) -> None:
    async def _run() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        num_terms = 0

        def term() -> None:
            nonlocal num_terms
            num_terms += 1
            if on_term is not None and num_terms == 1:
                on_term()
            else:
                task.cancel()

        loop.add_signal_handler(signal.SIGINT, task.cancel)
        loop.add_signal_handler(signal.SIGTERM, term)
        try:
            await main()
        except asyncio.CancelledError:
            pass

    uvloop.run(_run())
