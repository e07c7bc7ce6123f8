"""NIXL onboarding against a real kvtier (own thread, own agent): READ pool slots into a KV cache laid out like
vLLM's CPU attention, verify checksums in place; a slot rewritten under us is caught, never used."""

from __future__ import annotations

import importlib.util
import time

import pytest
import torch

from common.kvtier.sync_client import SyncTierClient
from services.kvtier.service import KvTierService
from services.worker.engines.vllm.tier.layout import KvLayout
from services.worker.engines.vllm.tier.nixl import NixlOnboarder
from tests.common.kvtier.test_sync_client import _client, kvtier_service

pytestmark = pytest.mark.skipif(importlib.util.find_spec("nixl") is None, reason="nixl not installed")

NUM_BLOCKS = 6


def _caches(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f"layers.{i}": torch.randn(NUM_BLOCKS, 2, 4, 16, generator=g) for i in range(3)}  # 1.5 KiB slabs


@pytest.fixture()
def kvtier():
    src = KvLayout.from_kv_caches(_caches(0), NUM_BLOCKS)
    yield from kvtier_service(block_bytes=src.block_bytes, nixl=True)


def _stats_with_nixl(client: SyncTierClient):
    deadline = time.monotonic() + 30  # kvtier registers its pool once NIXL is imported (seconds)
    while time.monotonic() < deadline:
        stats = client.stats()
        if stats is not None and stats.nixl:
            return stats
        time.sleep(0.2)
    pytest.fail("kvtier never registered its pool with NIXL")


def test_read_pool_slots_into_kv_blocks_and_verify(kvtier: KvTierService) -> None:
    src_caches = _caches(0)
    src = KvLayout.from_kv_caches(src_caches, NUM_BLOCKS)
    client = _client(kvtier.endpoint)
    dst_caches = {k: torch.zeros_like(v) for k, v in src_caches.items()}
    onboarder = NixlOnboarder(KvLayout.from_kv_caches(dst_caches, NUM_BLOCKS), "test")
    try:
        assert onboarder.connect(_stats_with_nixl(client))
        packed = src.pack([1, 2, 3]).numpy()
        client.store([(100 + i, packed[i].tobytes()) for i in range(3)])
        deadline = time.monotonic() + 5
        while client.num_stored < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        blocks, agent, truncated = client.lookup_slots([100, 101, 102], src.block_bytes, 2.0)
        assert not truncated
        assert agent == onboarder.peer_name != ""
        assert [b.slot >= 0 and not b.data for b in blocks] == [True] * 3
        onboarder.read([5, 0, 4], [b.slot for b in blocks])  # source blocks 1, 2, 3 -> our 5, 0, 4
        assert [onboarder.checksum(bid) for bid in (5, 0, 4)] == [b.checksum for b in blocks]
        for name, t in src_caches.items():
            assert torch.equal(dst_caches[name][[5, 0, 4]], t[[1, 2, 3]])
        # The slot of block 101 is rewritten under us (kvtier does not pin slots): the checksum catches it.
        assert kvtier.store is not None
        kvtier.store.pool.buf[blocks[1].slot * src.block_bytes + 10] ^= 0xFF
        onboarder.read([0], [blocks[1].slot])
        assert onboarder.checksum(0) != blocks[1].checksum
    finally:
        onboarder.close()
        client.close()
