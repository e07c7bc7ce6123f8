"""The blocking kvtier client vLLM's processes use, against a real kvtier (its own thread and event loop)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from cli.launcher import free_port
from common.kvtier.client import TierClientConfig
from common.kvtier.sync_client import SyncTierClient
from common.transport import TransportConfig
from services.kvtier.service import KvTierConfig, KvTierService

BLOCK_BYTES = 1024


def kvtier_service(block_bytes: int = BLOCK_BYTES, nixl: bool = False, transport: TransportConfig = TransportConfig()):
    """A kvtier with 64 host slots, served from its own thread and event loop (the clients under test block)."""
    service = KvTierService(KvTierConfig(endpoint=f"tcp://127.0.0.1:{free_port()}", host_bytes=64 * block_bytes,
                                         block_bytes=block_bytes, nixl=nixl, transport=transport))
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    tasks: list[asyncio.Task[None]] = []

    async def run() -> None:
        started = asyncio.Event()
        tasks.append(asyncio.create_task(service.run(started)))
        await started.wait()
        ready.set()
        try:
            await tasks[0]
        except asyncio.CancelledError:
            pass

    thread = threading.Thread(target=lambda: loop.run_until_complete(run()), daemon=True)
    thread.start()
    assert ready.wait(5)
    yield service
    loop.call_soon_threadsafe(tasks[0].cancel)
    thread.join(5)
    loop.close()


@pytest.fixture()
def kvtier():
    yield from kvtier_service()


def _client(endpoint: str, **kw) -> SyncTierClient:
    return SyncTierClient(TierClientConfig(endpoint=endpoint, lookup_timeout_s=0.5, **kw))


def _block(i: int) -> bytes:
    return bytes([i % 256]) * BLOCK_BYTES


def test_store_probe_fetch(kvtier: KvTierService) -> None:
    client = _client(kvtier.endpoint)
    try:
        client.store([(10 + i, _block(i)) for i in range(4)])
        deadline = time.monotonic() + 5
        while client.num_stored < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.num_stored == 4
        assert client.probe([10, 11, 12, 99, 13]) == 3
        assert client.probe([99, 10]) == 0
        # A probe counts no hit; a fetch does.
        assert kvtier.store is not None and kvtier.store.index.counters.hits_host == 0
        assert client.fetch([10, 11, 12, 99], BLOCK_BYTES, 1.0) == [_block(0), _block(1), _block(2)]
        assert kvtier.store.index.counters.hits_host == 3
        assert client.fetch([11], BLOCK_BYTES * 2, 1.0) == []  # wrong size: refused, never used
        assert client.num_bad_blocks == 1
    finally:
        client.close()


def test_dead_kvtier_answers_nothing_fast_and_backs_off() -> None:
    client = _client(f"tcp://127.0.0.1:{free_port()}", backoff_s=5.0)
    try:
        began = time.monotonic()
        assert client.probe([1, 2]) == 0
        assert time.monotonic() - began < 1.0
        began = time.monotonic()
        assert client.probe([1, 2]) == 0 and client.fetch([1], BLOCK_BYTES, 1.0) == []  # backing off: no wait
        assert time.monotonic() - began < 0.05
        client.store([(1, _block(1))])
        assert client.num_dropped == 1 and client.num_failures == 1
        client._down_until = 0.0  # the backoff is over: the next failure backs off twice as long
        assert client.probe([1]) == 0 and client._down_until - time.monotonic() > 5.0
    finally:
        client.close()
