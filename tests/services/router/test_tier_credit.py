"""Tier credit in seconds: a host or disk block is worth what its fetch saves against recomputing it on the
candidate, in blocks' worth of that candidate's prefill (services/router/tier_credit.py)."""

from __future__ import annotations

import random

import pytest

from common.kvtier.sources import Link, seconds_saved
from common.protocol import WorkerLoad
from services.router.cost import CostConfig
from services.router.index import TierOverlap
from services.router.policy import Candidate, PolicyConfig, choose_worker
from services.router.tier_credit import TierConfig, blocks_saved, tier_credit

# A mock worker's shape: 64-token blocks, 36,864 KV bytes per token (2.36 MB a block), 2,000 prompt tokens/s
# (32 ms to compute a block).
BLOCK, BPT, RATE = 64, 36864, 2000.0
HOST = Link(2.9e9, 0.001)  # TierConfig's host default: 0.81 ms a block + 1 ms a load


@pytest.mark.parametrize(
    ("num_blocks", "block_tokens", "bytes_per_token", "rate", "link", "lo", "hi"),
    [
        # Fast host: 8 blocks save 8 * 32 ms - (1 + 8 * 0.81) ms: nearly all of them.
        pytest.param(8, BLOCK, BPT, RATE, HOST, 7.7, 7.8, id="fast-host-nearly-full"),
        # Disk at 50 MB/s: 47 ms to fetch a block that computes in 32 ms: no credit, never negative.
        pytest.param(8, BLOCK, BPT, RATE, Link(5e7, 0.002), 0.0, 0.0, id="slow-disk-zero"),
        # Fetching exactly as fast as computing (no latency): nothing saved.
        pytest.param(4, 1, 1000, 1000.0, Link(1e6, 0.0), 0.0, 0.0, id="break-even"),
        # Free fetch: every block saved, never more.
        pytest.param(5, BLOCK, 0, RATE, Link(1e9, 0.0), 5.0, 5.0, id="free-fetch-full"),
        # Unknown KV size: the load costs its latency only (1 ms of 4 blocks' 128 ms).
        pytest.param(4, BLOCK, 0, RATE, HOST, 3.96, 3.97, id="unknown-bytes-latency-only"),
        # Unknown block size: latency not priced, bytes against compute per token (1 - 36,864 * 2,000 / 2.9e9).
        pytest.param(4, 0, BPT, RATE, HOST, 3.89, 3.91, id="unknown-block-size"),
        # A load's latency alone can eat a short run: 1 block of 1 token at 1,000 tokens/s (1 ms) vs 2 ms.
        pytest.param(1, 1, 0, 1000.0, Link(1e9, 0.002), 0.0, 0.0, id="latency-eats-short-run"),
        pytest.param(0, BLOCK, BPT, RATE, HOST, 0.0, 0.0, id="no-blocks"),
    ],
)
def test_blocks_saved(num_blocks, block_tokens, bytes_per_token, rate, link, lo, hi) -> None:
    assert lo <= blocks_saved(num_blocks, block_tokens, bytes_per_token, rate, link) <= hi


def test_slow_worker_values_tier_blocks_more() -> None:
    """The same disk run is worth more blocks to a worker that computes slowly: recomputing costs it more."""
    disk = Link(1e9, 0.002)
    slow, fast = (blocks_saved(8, BLOCK, BPT, rate, disk) for rate in (500.0, 20000.0))
    assert 7.5 < slow <= 8.0 and 0.0 <= fast < 4.0 and slow > fast


def test_seconds_saved_is_the_remote_tier_arithmetic() -> None:
    # 4 blocks of 64 tokens at 1,000 tokens/s = 256 ms; moving 4 * 1 MB at 1e8 B/s + 5 ms = 45 ms.
    assert seconds_saved(4, 64, 10**6, 1000.0, Link(1e8, 0.005)) == pytest.approx(0.211)
    assert seconds_saved(4, 64, 10**8, 1000.0, Link(1e8, 0.005)) < 0  # recomputing is faster: negative
    assert seconds_saved(0, 64, 10**8, 1000.0, Link(1e8, 0.005)) == 0.0


@pytest.mark.parametrize(
    ("overlap", "tiers", "lo", "hi"),
    [
        pytest.param(TierOverlap(3, 3, 3), TierConfig(), 3.0, 3.0, id="device-only"),
        pytest.param(TierOverlap(), TierConfig(), 0.0, 0.0, id="none"),
        # 2 on device + 4 from host (~0.97 each) + 2 from a 1 GB/s disk (~0.89 each).
        pytest.param(TierOverlap(2, 6, 8), TierConfig(), 7.6, 7.7, id="device-host-disk"),
        # A disk slower than recompute adds nothing to the device and host blocks before it.
        pytest.param(TierOverlap(2, 6, 8), TierConfig(disk_bytes_per_s=5e7), 5.8, 5.9, id="slow-disk"),
    ],
)
def test_tier_credit(overlap, tiers, lo, hi) -> None:
    assert lo <= tier_credit(overlap, BLOCK, BPT, RATE, tiers) <= hi


def test_disk_prefix_beats_shorter_device_prefix_when_disk_is_fast() -> None:
    """Before, a disk block counted 0.25: 10 disk blocks (2.5) lost to 4 on device. Priced in seconds at a
    mock worker's shape, they save ~9 blocks of compute and win; on a disk slower than recompute they lose."""
    load = WorkerLoad(num_free_blocks=100, num_total_blocks=100, prefill_tokens_per_s=RATE)
    candidates = [Candidate("a", load, kv_bytes_per_token=BPT), Candidate("b", load, kv_bytes_per_token=BPT)]
    overlaps = {"a": TierOverlap(0, 0, 10), "b": TierOverlap(4, 4, 4)}
    fast = choose_worker(candidates, overlaps, 12, PolicyConfig(), random.Random(0), 0, BLOCK)
    assert fast.worker_id == "a" and 8.5 < fast.overlap_blocks < 10.0
    slow_disk = PolicyConfig(tiers=TierConfig(disk_bytes_per_s=5e7))
    assert choose_worker(candidates, overlaps, 12, slow_disk, random.Random(0), 0, BLOCK).worker_id == "b"


def test_unknown_worker_kv_size_uses_the_configured_one() -> None:
    """A worker that registered no KV size is priced at CostConfig.kv_bytes_per_token."""
    load = WorkerLoad(num_free_blocks=100, num_total_blocks=100, prefill_tokens_per_s=RATE)
    overlaps = {"a": TierOverlap(0, 0, 8)}
    slow_disk = TierConfig(disk_bytes_per_s=5e7)
    known = PolicyConfig(tiers=slow_disk, cost=CostConfig(kv_bytes_per_token=BPT))
    choice = choose_worker([Candidate("a", load)], overlaps, 8, known, random.Random(0), 0, BLOCK)
    assert choice.overlap_blocks == 0.0  # 47 ms a block to fetch vs 32 ms to compute
    unknown = choose_worker([Candidate("a", load)], overlaps, 8, PolicyConfig(tiers=slow_disk), random.Random(0), 0,
                            BLOCK)
    assert unknown.overlap_blocks > 7.9  # size unknown: latency only


def test_tier_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="bandwidths"):
        TierConfig(disk_bytes_per_s=0.0)
    with pytest.raises(ValueError, match="latencies"):
        TierConfig(host_latency_s=-1.0)
