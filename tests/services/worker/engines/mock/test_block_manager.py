"""Block manager: prefix matching, refcounted sharing, LRU eviction, KV events, free counts."""

from __future__ import annotations

import pytest

from common.hashing import block_hashes
from services.worker.engines.mock.block_manager import (
    BlockManager,
    BlocksRemoved,
    BlocksStored,
    Match,
)

BS = 4


def _run(bm: BlockManager, seq_id: str, token_ids: list[int]) -> Match:
    """Allocate a sequence for all of ``token_ids`` and mark them computed."""
    match = bm.match_prefix(token_ids)
    assert bm.allocate(seq_id, match, len(token_ids))
    bm.commit(seq_id, token_ids, len(token_ids))
    return match


def test_match_prefix_counts_whole_cached_blocks() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS)
    assert bm.match_prefix([1, 2, 3, 4, 5]) == Match(0, ())
    _run(bm, "a", list(range(10)))  # two full blocks cached, the third partial
    block_ids = bm.block_ids("a")
    assert bm.match_prefix(list(range(10))) == Match(8, block_ids[:2])
    assert bm.match_prefix(list(range(7))) == Match(4, block_ids[:1])
    assert bm.match_prefix([0, 1, 2, 3, 9, 9, 9, 9]) == Match(4, block_ids[:1])
    assert bm.match_prefix([9, 1, 2, 3, 4, 5, 6, 7]) == Match(0, ())


def test_two_sequences_share_a_prefix_by_refcount() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS)
    prompt = list(range(8))
    _run(bm, "a", prompt + [100, 101])
    shared = bm.block_ids("a")[:2]
    match = _run(bm, "b", prompt + [200])
    assert match == Match(8, shared)
    assert bm.block_ids("b")[:2] == shared
    assert [bm.ref_count(block_id) for block_id in shared] == [2, 2]
    assert bm.num_free_blocks == 8 - 4  # a: 3 blocks, b: 1 fresh
    bm.free("a")
    assert [bm.ref_count(block_id) for block_id in shared] == [1, 1]
    assert bm.num_free_blocks == 8 - 3
    bm.free("b")
    assert bm.num_free_blocks == 8
    assert bm.num_cached_blocks == 2  # still reusable
    assert bm.match_prefix(prompt).num_cached_tokens == 8


def test_lru_evicts_least_recently_freed_tail_first() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    a, b = [1, 2, 3, 4], [5, 6, 7, 8]
    _run(bm, "a", a)
    _run(bm, "b", b)
    ha, hb = block_hashes(a, 2, 0), block_hashes(b, 2, 0)
    bm.free("a")
    bm.free("b")
    bm.drain_events()
    # Touch a's first block again: it becomes the most recently used.
    _run(bm, "a0", [1, 2])
    bm.free("a0")
    assert bm.num_free_blocks == 4
    evicted: list[int] = []
    for index in range(4):
        assert bm.allocate(f"x{index}", Match(0, ()), 2)
        events = bm.drain_events()
        assert len(events) == 1 and isinstance(events[0], BlocksRemoved)
        evicted.extend(events[0].block_hashes)
    # a's tail, then b (tail first), then a's head (used last).
    assert evicted == [ha[1], hb[1], hb[0], ha[0]]
    assert bm.num_cached_blocks == 0
    assert not bm.allocate("y", Match(0, ()), 1)


def test_free_list_is_used_before_evicting_cached_blocks() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    _run(bm, "a", [1, 2, 3])  # one cached block, one partial (unhashed) block
    bm.free("a")
    bm.drain_events()
    assert bm.allocate("b", Match(0, ()), 8)  # four blocks: three free ones, then one eviction
    assert bm.num_cached_blocks == 0
    assert bm.drain_events() == [BlocksRemoved(tuple(block_hashes([1, 2], 2, 0)))]


def test_allocate_failure_changes_nothing() -> None:
    bm = BlockManager(num_blocks=3, block_size=BS)
    _run(bm, "a", list(range(8)))
    bm.free("a")
    match = bm.match_prefix(list(range(8)) + [50])
    # Sharing the two cached blocks takes them off the evictable list: only one block is left for new ones.
    assert not bm.allocate("b", match, 8 + 5)
    assert not bm.has_seq("b")
    assert bm.num_free_blocks == 3 and bm.num_cached_blocks == 2
    assert bm.allocate("b", match, 8 + 4)
    assert bm.num_free_blocks == 0


def test_append_grows_by_whole_blocks() -> None:
    bm = BlockManager(num_blocks=3, block_size=BS)
    assert bm.allocate("a", Match(0, ()), 3)
    assert bm.num_seq_blocks("a") == 1
    assert bm.append("a", 4) and bm.num_seq_blocks("a") == 1
    assert bm.append("a", 5) and bm.num_seq_blocks("a") == 2
    assert not bm.append("a", 13)
    assert bm.num_seq_blocks("a") == 2
    assert bm.append("a", 12) and bm.num_free_blocks == 0


def test_commit_emits_stored_events_with_parent() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS, hash_seed=3)
    tokens = list(range(9))
    hashes = block_hashes(tokens, BS, 3)
    assert bm.allocate("a", Match(0, ()), 9)
    bm.commit("a", tokens, 3)
    assert bm.drain_events() == []
    bm.commit("a", tokens, 5)
    assert bm.drain_events() == [BlocksStored((hashes[0],), None)]
    bm.commit("a", tokens, 9)
    assert bm.drain_events() == [BlocksStored((hashes[1],), hashes[0])]
    assert bm.drain_events() == []


def test_concurrent_duplicate_prefix_is_cached_once() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS)
    tokens = list(range(8))
    for seq_id in ("a", "b"):
        assert bm.allocate(seq_id, bm.match_prefix(tokens), 8)  # neither computed yet: no hits
    bm.commit("a", tokens, 8)
    bm.commit("b", tokens, 8)
    assert bm.drain_events() == [BlocksStored(tuple(block_hashes(tokens, BS, 0)), None)]
    assert bm.num_cached_blocks == 2
    bm.free("b")  # b's duplicate blocks were never cached: straight back to the free list
    bm.free("a")
    assert bm.num_free_blocks == 8 and bm.num_cached_blocks == 2
    assert bm.match_prefix(tokens).num_cached_tokens == 8


def test_free_unknown_sequence_is_ignored() -> None:
    bm = BlockManager(num_blocks=2, block_size=BS)
    assert not bm.free("nope")
    with pytest.raises(ValueError):
        BlockManager(num_blocks=0, block_size=BS)
