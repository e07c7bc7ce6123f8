"""Event-loop lag: how late a timer fires. Anything heavy run on the loop (a long template, a big JSON, a
traceback) shows here as lag, and every stream on this frontend waited that long."""

from __future__ import annotations

import asyncio

from prometheus_client import Histogram

# Seconds between probes: ~8 wake-ups a second, negligible CPU.
PROBE_INTERVAL_S = 0.125


async def watch_loop_lag(histogram: Histogram, interval_s: float = PROBE_INTERVAL_S) -> None:
    loop = asyncio.get_running_loop()
    while True:
        start_s = loop.time()
        await asyncio.sleep(interval_s)
        histogram.observe(max(0.0, loop.time() - start_s - interval_s))
