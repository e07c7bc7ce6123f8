"""A kvtier that stalls (accepts TCP, never answers) costs a recompute: every lookup returns [], none raises."""

from __future__ import annotations

import asyncio
import socket

from common.kvtier.client import TierClient, TierClientConfig


async def test_stalled_kvtier_lookups_return_empty_never_raise() -> None:
    # A listener that accepts connections and never speaks: a SIGSTOPped kvtier as the kernel shows it. With a
    # one-message queue, concurrent lookups block in send until the outer deadline (the builtin TimeoutError).
    stalled = socket.socket()
    stalled.bind(("127.0.0.1", 0))
    stalled.listen(8)
    port = stalled.getsockname()[1]
    client = TierClient(TierClientConfig(endpoint=f"tcp://127.0.0.1:{port}", lookup_timeout_s=0.2,
                                         backoff_s=0.0, hwm=1))
    try:
        for _ in range(3):
            results = await asyncio.gather(*(client.lookup([1, 2, 3]) for _ in range(6)), return_exceptions=True)
            assert results == [[]] * 6, results
        assert client.num_failures >= 6
    finally:
        await client.close()
        stalled.close()
