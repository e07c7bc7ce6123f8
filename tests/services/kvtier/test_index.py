"""TierIndex: exact placement, LRU eviction per tier, the disk frequency filter and the events they publish."""

from __future__ import annotations

from common.protocol import BlockRemoved, BlockStored
from services.kvtier.index import Demote, StorePlan, TierIndex


def _store(index: TierIndex, *hashes: int) -> list[StorePlan]:
    return [index.store(h, checksum=h * 10, size=100) for h in hashes]


def test_store_fills_host_slots_in_order_and_publishes_host_events() -> None:
    index = TierIndex(host_slots=3)
    plans = _store(index, 11, 12, 13)
    assert [p.slot for p in plans] == [0, 1, 2]
    assert all(not p.demotes for p in plans)
    assert index.hashes("host") == [11, 12, 13]
    assert index.get(12).checksum == 120 and index.get(12).size == 100
    assert index.drain_events() == [BlockStored(block_hashes=(11, 12, 13), parent_hash=None, tier="host")]
    assert index.drain_events() == []


def test_present_block_is_refreshed_not_rewritten() -> None:
    index = TierIndex(host_slots=2)
    _store(index, 1, 2)
    plan = index.store(1, checksum=10, size=100)
    assert plan == StorePlan(slot=None, present=True)
    assert index.hashes("host") == [2, 1]  # 1 is now most recent
    _store(index, 3)  # evicts 2, the LRU
    assert index.hashes("host") == [1, 3]


def test_host_eviction_without_disk_drops_lru() -> None:
    index = TierIndex(host_slots=2)
    _store(index, 1, 2)
    index.drain_events()
    plan = index.store(3, 30, 100)
    assert plan == StorePlan(slot=0)  # block 1's slot, reused
    assert 1 not in index and index.hashes("host") == [2, 3]
    assert index.drain_events() == [BlockRemoved(block_hashes=(1,), tier="host"),
                                    BlockStored(block_hashes=(3,), parent_hash=None, tier="host")]
    assert index.counters.evictions_host == 1


def test_lookup_returns_leading_run_counts_hits_and_refreshes_lru() -> None:
    index = TierIndex(host_slots=4)
    _store(index, 1, 2, 3, 4)
    run = index.lookup([1, 2, 99, 3])
    assert [e.block_hash for e in run] == [1, 2]
    assert [index.get(h).hits for h in (1, 2, 3, 4)] == [1, 1, 0, 0]
    assert index.hashes("host") == [3, 4, 1, 2]
    assert index.lookup([99, 1]) == []
    assert (index.counters.hits_host, index.counters.misses) == (2, 1)
    assert [e.block_hash for e in index.lookup([1, 2, 3], max_blocks=2)] == [1, 2]


def test_frequency_filter_only_hit_blocks_reach_disk() -> None:
    index = TierIndex(host_slots=2, disk_slots=2, disk_min_hits=2)
    _store(index, 1, 2)
    index.lookup([1])
    index.lookup([1])  # 1 hit twice, 2 never
    index.lookup([2])  # 2 hit once: below the filter
    index.drain_events()
    plan = index.store(3, 30, 100)  # LRU is 1 (hit before 2's lookup)
    assert plan == StorePlan(slot=0, demotes=(Demote(block_hash=1, host_slot=0, disk_slot=0, size=100),))
    assert index.get(1).tier == "disk" and index.get(1).slot == 0
    plan = index.store(4, 40, 100)  # LRU is now 2, hit once: dropped
    assert plan == StorePlan(slot=1)
    assert 2 not in index
    assert index.hashes("disk") == [1] and index.hashes("host") == [3, 4]
    assert index.drain_events() == [
        BlockRemoved(block_hashes=(1,), tier="host"),
        BlockStored(block_hashes=(1,), parent_hash=None, tier="disk"),
        BlockStored(block_hashes=(3,), parent_hash=None, tier="host"),
        BlockRemoved(block_hashes=(2,), tier="host"),
        BlockStored(block_hashes=(4,), parent_hash=None, tier="host"),
    ]
    assert (index.counters.demotions, index.counters.evictions_host) == (1, 1)


def test_disk_lru_eviction_and_disk_hits() -> None:
    index = TierIndex(host_slots=1, disk_slots=2, disk_min_hits=0)  # everything earns disk
    _store(index, 1, 2, 3)  # 1 -> disk, 2 -> disk
    assert index.hashes("disk") == [1, 2]
    run = index.lookup([1])
    assert run[0].tier == "disk" and index.counters.hits_disk == 1
    index.drain_events()
    plan = index.store(4, 40, 100)  # host LRU 3 -> disk; disk full: its LRU (2) dropped, slot reused
    assert plan.demotes == (Demote(block_hash=3, host_slot=0, disk_slot=1, size=100),)
    assert 2 not in index and index.hashes("disk") == [1, 3]
    assert index.drain_events() == [
        BlockRemoved(block_hashes=(3,), tier="host"),
        BlockRemoved(block_hashes=(2,), tier="disk"),
        BlockStored(block_hashes=(3,), parent_hash=None, tier="disk"),
        BlockStored(block_hashes=(4,), parent_hash=None, tier="host"),
    ]
    assert index.counters.evictions_disk == 1


def test_remove_frees_the_slot() -> None:
    index = TierIndex(host_slots=2)
    _store(index, 1, 2)
    index.drain_events()
    assert index.remove(1).slot == 0
    assert index.remove(1) is None
    assert index.store(3, 30, 100).slot == 0
    assert index.drain_events()[0] == BlockRemoved(block_hashes=(1,), tier="host")
    assert sorted(index.snapshot()) == [(2, "host"), (3, "host")]


def test_no_host_slots_stores_nothing() -> None:
    index = TierIndex(host_slots=0)
    assert index.store(1, 1, 1) == StorePlan(slot=None)
    assert len(index) == 0


def test_peek_is_a_lookup_without_side_effects() -> None:
    index = TierIndex(host_slots=4)
    _store(index, 1, 2, 3)
    assert [e.block_hash for e in index.peek([1, 2, 99, 3])] == [1, 2]
    assert [e.block_hash for e in index.peek([1, 2, 3], max_blocks=2)] == [1, 2]
    assert index.peek([99, 1]) == []
    assert [index.get(h).hits for h in (1, 2, 3)] == [0, 0, 0]
    assert index.hashes("host") == [1, 2, 3]
    assert (index.counters.hits_host, index.counters.misses) == (0, 0)
