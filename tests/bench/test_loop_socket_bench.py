"""bench/loop_socket.py runs both socket layers over the same echo and counts every round trip."""

from __future__ import annotations

import pytest

from bench.loop_socket import _run


@pytest.mark.parametrize("mode", ["zmq.asyncio", "loop_socket"])
async def test_each_mode_completes_every_round_trip(mode: str) -> None:
    out = await _run(mode, 640, 64)
    assert out["mode"] == mode and out["round_trips"] == 640
    assert out["round_trips_per_s"] > 0 and out["cpu_us_per_round_trip"] > 0
