"""kvtier in-process with the mock engine: evicted blocks go to kvtier and come back as cached tokens;
a wrong block, a dead kvtier or a slow one costs a recompute, never an error."""

from __future__ import annotations

import asyncio

import pytest

from common.kvtier.client import FetchedBlock, TierClient, TierClientConfig
from common.protocol import SamplingParams
from common.timing import TimingModel
from services.kvtier.service import KvTierConfig, KvTierService
from services.worker.engine import EngineRequest
from services.worker.engines.mock.config import MockEngineConfig
from services.worker.engines.mock.engine import MockEngine

BS, KV_PER_TOKEN = 16, 64  # 1 KiB blocks


def _engine(tier, num_blocks: int = 8) -> MockEngine:
    return MockEngine(MockEngineConfig(num_blocks=num_blocks, block_size=BS, max_model_len=512,
                                       timing=TimingModel(speedup=float("inf")), kv_bytes_per_token=KV_PER_TOKEN,
                                       tier=tier))


async def _run(engine: MockEngine, rid: str, prompt: list[int]) -> int:
    cached = -1
    async for out in engine.generate(EngineRequest(rid, tuple(prompt), SamplingParams(max_tokens=2))):
        cached = out.num_cached_tokens
    return cached


async def _until(pred, timeout_s: float = 3.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


@pytest.fixture()
async def kvtier():
    service = KvTierService(KvTierConfig(endpoint="tcp://127.0.0.1:0", host_bytes=64 * 1024,
                                         block_bytes=BS * KV_PER_TOKEN, nixl=False))
    ready = asyncio.Event()
    task = asyncio.create_task(service.run(ready))
    await asyncio.wait_for(ready.wait(), 5)
    yield service
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass


PROMPT_A = list(range(1000, 1000 + 4 * BS + 3))  # 4 full blocks + 3 tokens
FILLER = [list(range(5000 + 100 * i, 5000 + 100 * i + 4 * BS + 3)) for i in range(3)]


async def _evict_a(engine: MockEngine) -> None:
    for i, prompt in enumerate(FILLER):  # 8-block pool: these push A's blocks out
        await _run(engine, f"f{i}", prompt)
    assert engine._blocks.match_prefix(PROMPT_A[:-1]).num_cached_tokens == 0


async def test_evicted_prefix_is_onboarded_from_kvtier(kvtier: KvTierService) -> None:
    client = TierClient(TierClientConfig(endpoint=kvtier.endpoint, worker_id="w"))
    engine = _engine(client)
    await engine.start()
    try:
        assert await _run(engine, "a1", PROMPT_A) == 0
        await _evict_a(engine)
        await _until(lambda: all(h in kvtier.store.index for h in _hashes(PROMPT_A)))
        assert await _run(engine, "a2", PROMPT_A) == 4 * BS
        assert engine.num_onboards == 1
        # The load is reported: its tier, bytes and (lookup + move) time, marked simulated (the move is made up:
        # the router's tier-speed learner skips it).
        (load,) = engine.counters().recent_tier_loads
        assert (load.seq, load.tier, load.num_bytes) == (1, "host", 4 * BS * KV_PER_TOKEN) and load.seconds > 0
        assert load.simulated
        stats = kvtier.stats("s")
        assert stats.hits_host >= 4 and stats.bytes_out >= 4 * BS * KV_PER_TOKEN
    finally:
        await engine.shutdown()


async def test_other_engine_onboards_what_one_offloaded(kvtier: KvTierService) -> None:
    a = _engine(TierClient(TierClientConfig(endpoint=kvtier.endpoint, worker_id="a")))
    b = _engine(TierClient(TierClientConfig(endpoint=kvtier.endpoint, worker_id="b")))
    await a.start()
    await b.start()
    try:
        await _run(a, "a1", PROMPT_A)
        await _evict_a(a)
        await _until(lambda: all(h in kvtier.store.index for h in _hashes(PROMPT_A)))
        assert await _run(b, "b1", PROMPT_A) == 4 * BS
    finally:
        await a.shutdown()
        await b.shutdown()


class _WrongTier:
    """Returns a block whose bytes are not the KV of its prefix (a checksum-valid but wrong block)."""

    def offload(self, block_hashes, make_payload) -> None:
        pass

    async def lookup(self, block_hashes):
        return [FetchedBlock(block_hashes[0], b"\0" * (BS * KV_PER_TOKEN), "host")]

    async def close(self) -> None:
        pass


async def test_wrong_block_means_recompute() -> None:
    engine = _engine(_WrongTier())
    await engine.start()
    try:
        assert await _run(engine, "a", PROMPT_A) == 0
        assert engine.num_onboard_rejected == 1 and engine.num_onboards == 0
    finally:
        await engine.shutdown()


async def test_dead_kvtier_costs_a_recompute_only() -> None:
    from cli.launcher import free_port

    client = TierClient(TierClientConfig(endpoint=f"tcp://127.0.0.1:{free_port()}", lookup_timeout_s=0.1,
                                         backoff_s=10.0))
    engine = _engine(client)
    await engine.start()
    try:
        loop = asyncio.get_running_loop()
        start = loop.time()
        assert await _run(engine, "a1", PROMPT_A) == 0
        await _evict_a(engine)  # offloads go nowhere (dropped)
        assert await _run(engine, "a2", PROMPT_A) == 0
        assert loop.time() - start < 1.0  # one timeout, then backoff: no lookup waits again
        assert client.num_failures >= 1
    finally:
        await engine.shutdown()


def _hashes(prompt: list[int]) -> list[int]:
    from common.hashing import block_hashes

    return block_hashes(prompt[:-1], BS, 0)


async def test_stored_blocks_are_published_at_once_not_at_the_next_poll(kvtier: KvTierService) -> None:
    # The events loop sleeps until a message is handled (a poll cost the prefill core ~1% idle); a store's events
    # must still go out right after it, long before the loop's 1 s drain timeout.
    published: list[tuple] = []
    kvtier._publish = lambda events: published.append(events)  # type: ignore[method-assign]
    await asyncio.sleep(0.05)  # the loop is asleep now
    client = TierClient(TierClientConfig(endpoint=kvtier.endpoint))
    try:
        client.offload([7], lambda _h: b"x" * (BS * KV_PER_TOKEN))
        await _until(lambda: bool(published), timeout_s=0.5)
    finally:
        await client.close()
    assert [e.block_hashes for e in published[0]] == [(7,)]
