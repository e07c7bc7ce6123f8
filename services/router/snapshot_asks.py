"""When the router asks KV sources for their snapshots: a source that registered (or whose events broke off)
gets no prefix credit until its snapshot is loaded, so it is asked at once and again every ``retry_s`` until it
answers. Woken by a registration, else once a retry period: the 20 ms poll this replaced cost an idle router
half its CPU (bench/results/token_cpu.json).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from services.router.event_tracker import EventTracker


async def ask_snapshots(tracker: EventTracker, due: asyncio.Event, retry_s: float, ask: Callable[[str], None]) -> None:
    """Forever: ``ask(source_id)`` for every source ``tracker`` says is due, after ``due`` is set or each
    ``retry_s`` (a retry comes 1-2 ``retry_s`` after the ask it repeats)."""
    while True:
        try:
            await asyncio.wait_for(due.wait(), retry_s)
        except TimeoutError:
            pass
        due.clear()
        for source_id in tracker.due_snapshots(time.monotonic(), retry_s):
            ask(source_id)
