"""Prefix index bookkeeping: per-tier overlaps, removal, clearing, event gaps, snapshots, approx TTL."""

from __future__ import annotations

import random

import pytest

from common.protocol import (
    AllCleared,
    BlockRemoved,
    BlockStored,
    KvEvents,
    KvSnapshot,
    StoredBlock,
    decode,
    encode,
)
from services.router.approx_index import ApproxIndex
from services.router.event_tracker import EventTracker
from services.router.index import NO_OVERLAP, PrefixIndex, TierOverlap

REQ = [101, 102, 103, 104, 105, 106]  # a request's chained hashes (values are arbitrary here)


def stored(hashes, tier="device", parent=None) -> BlockStored:
    return BlockStored(block_hashes=tuple(hashes), parent_hash=parent, tier=tier)


def batch(worker_id: str, event_id: int, *events) -> KvEvents:
    return KvEvents(worker_id=worker_id, event_id=event_id, events=tuple(events))


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        # layout: tier -> indices of REQ held there by worker "a"
        ({"device": [0, 1, 2]}, TierOverlap(3, 3, 3)),
        ({"device": [0, 1, 3, 4]}, TierOverlap(2, 2, 2)),  # the run stops at the first hole
        ({"device": [1, 2, 3]}, None),  # first block missing: nothing reusable
        ({"device": [0, 1], "host": [2, 3], "disk": [4]}, TierOverlap(2, 4, 5)),
        ({"host": [0, 1], "device": [2, 3]}, TierOverlap(0, 4, 4)),  # device run 0, but host-or-better 4
        ({"disk": [0], "device": [1, 2, 3, 4, 5]}, TierOverlap(0, 0, 6)),
        ({"device": [0, 1, 2], "host": [0, 1, 2, 3]}, TierOverlap(3, 4, 4)),  # one block in two tiers
        ({"device": list(range(6))}, TierOverlap(6, 6, 6)),
    ],
)
def test_overlap_per_tier(layout: dict[str, list[int]], expected: TierOverlap | None) -> None:
    index = PrefixIndex()
    for tier, positions in layout.items():
        index.apply("a", stored([REQ[i] for i in positions], tier))
    assert index.overlaps(REQ).get("a") == expected


def test_overlaps_many_workers_and_unknown_hashes() -> None:
    index = PrefixIndex()
    index.apply("a", stored(REQ[:4]))
    index.apply("b", stored(REQ[:2]))
    index.apply("c", stored([999, 998]))
    index.apply("d", stored(REQ[:1], "host"))
    assert index.overlaps(REQ) == {"a": TierOverlap(4, 4, 4), "b": TierOverlap(2, 2, 2), "d": TierOverlap(0, 1, 1)}
    assert index.overlaps([999]) == {"c": TierOverlap(1, 1, 1)}
    assert index.overlaps([12345]) == {}
    assert index.overlaps([]) == {}
    assert index.overlaps(REQ, worker_ids=["b", "zz"]) == {"b": TierOverlap(2, 2, 2)}
    assert index.num_blocks == 4 + 2 + 2 + 1
    assert index.source_num_blocks("a") == 4


def test_shared_source_counts_for_every_worker() -> None:
    index = PrefixIndex(shared_source_ids=["kvtier"])
    index.apply("a", stored(REQ[:2]))
    index.apply("kvtier", stored(REQ[:4], "host"))
    index.apply("kvtier", stored(REQ[4:5], "disk"))
    # a: device 2, then host up to 4, then disk 5. "new" has no blocks of its own: shared only.
    assert index.overlaps(REQ, worker_ids=["a", "new"]) == {"a": TierOverlap(2, 4, 5), "new": TierOverlap(0, 4, 5)}
    # Shared sources are not workers: left out of the default result.
    assert index.overlaps(REQ) == {"a": TierOverlap(2, 4, 5)}


def test_mark_shared_after_events() -> None:
    index = PrefixIndex()
    index.apply("kvtier", stored(REQ[:3], "host"))
    index.apply("a", stored([7]))
    index.mark_shared("kvtier")
    assert index.overlaps(REQ, worker_ids=["a"]) == {"a": TierOverlap(0, 3, 3)}


def test_removed_and_idempotent() -> None:
    index = PrefixIndex()
    index.apply("a", stored(REQ[:4]))
    index.apply("a", stored(REQ[:4]))  # duplicate store counts once
    assert index.num_blocks == 4
    index.apply("a", BlockRemoved(block_hashes=(REQ[2],), tier="device"))
    assert index.overlaps(REQ) == {"a": TierOverlap(2, 2, 2)}
    index.apply("a", BlockRemoved(block_hashes=(REQ[2], 555), tier="device"))  # not held: no-op
    index.apply("a", BlockRemoved(block_hashes=(REQ[0],), tier="host"))  # wrong tier: no-op
    index.apply("zz", BlockRemoved(block_hashes=(REQ[0],), tier="device"))  # unknown source: no-op
    assert index.num_blocks == 3


def test_all_cleared_one_tier_only() -> None:
    index = PrefixIndex()
    index.apply("a", stored(REQ[:3]))
    index.apply("a", stored(REQ[:5], "host"))
    index.apply("b", stored(REQ[:3]))
    index.apply("a", AllCleared(tier="device"))
    assert index.overlaps(REQ) == {"a": TierOverlap(0, 5, 5), "b": TierOverlap(3, 3, 3)}
    assert index.num_blocks == 5 + 3


def test_remove_worker_frees_everything_and_bit_reuse() -> None:
    index = PrefixIndex()
    index.apply("a", stored(REQ))
    index.apply("b", stored(REQ[:2]))
    index.remove_worker("a")
    assert index.overlaps(REQ) == {"b": TierOverlap(2, 2, 2)}
    assert index.num_blocks == 2
    assert index.sources() == ["b"]
    index.apply("c", stored(REQ[:1]))  # takes a's freed bit: must not inherit a's blocks
    assert index.overlaps(REQ) == {"b": TierOverlap(2, 2, 2), "c": TierOverlap(1, 1, 1)}
    index.remove_worker("nobody")  # harmless


def test_event_tracker_verdicts() -> None:
    tracker = EventTracker(resnapshot_every=3)
    assert tracker.observe("a", 0).action == "apply"
    assert tracker.observe("a", 1).action == "apply"
    assert tracker.observe("a", 1).action == "duplicate"
    check = tracker.observe("a", 4)
    assert (check.action, check.expected_event_id, check.needs_snapshot) == ("gap", 2, True)
    assert [tracker.observe("a", i).action for i in (5, 6, 7)] == ["awaiting_snapshot", "awaiting_snapshot", "gap"]
    tracker.snapshot_loaded("a", 6)
    assert tracker.observe("a", 7).action == "apply"
    assert tracker.observe("a", 0).action == "restart"
    # A source first seen mid-stream: we missed its earlier batches.
    first = tracker.observe("b", 5)
    assert (first.action, first.expected_event_id) == ("gap", 0)
    tracker.forget("a")
    assert tracker.last_event_id("a") is None


def test_apply_events_in_order_and_duplicates() -> None:
    index = PrefixIndex()
    assert index.apply_events(batch("a", 0, stored(REQ[:2]))).action == "apply"
    second = batch("a", 1, stored(REQ[2:3]), BlockRemoved(block_hashes=(REQ[1],), tier="device"))
    assert index.apply_events(second).action == "apply"
    assert index.apply_events(batch("a", 1, stored(REQ[1:2]))).action == "duplicate"  # dropped
    assert index.overlaps(REQ) == {"a": TierOverlap(1, 1, 1)}


def test_gap_then_snapshot_rebuilds_and_replays() -> None:
    index = PrefixIndex()
    index.apply_events(batch("a", 0, stored(REQ[:2])))
    index.apply_events(batch("a", 1, stored([900])))
    check = index.apply_events(batch("a", 3, stored(REQ[2:4])))  # batch 2 lost
    assert check.needs_snapshot and check.expected_event_id == 2
    # Held, not applied, until the snapshot arrives; meanwhile "a" gets no credit at all (fail closed).
    assert index.overlaps(REQ) == {}
    assert not index.credited("a")
    held = index.apply_events(batch("a", 4, stored(REQ[4:5])))
    assert held.action == "awaiting_snapshot" and not held.needs_snapshot
    # The snapshot reflects batches 0..2 (batch 2 had removed 900 and stored REQ[2] on host).
    snap = KvSnapshot(request_id="s", worker_id="a", event_id=2, tier_blocks=(
        StoredBlock(REQ[0], None, "device"), StoredBlock(REQ[1], REQ[0], "device"),
        StoredBlock(REQ[2], REQ[1], "host"),
    ))
    result = index.load_snapshot("a", snap)
    assert (result.num_blocks, result.num_replayed, result.needs_snapshot) == (3, 2, False)
    # Batches 3 and 4 replayed on top: REQ[2:5] on device (REQ[2] also on host).
    assert index.overlaps(REQ) == {"a": TierOverlap(5, 5, 5)}
    assert index.overlaps([900]) == {}
    assert index.apply_events(batch("a", 5, stored(REQ[5:6]))).action == "apply"
    assert index.overlaps(REQ)["a"] == TierOverlap(6, 6, 6)
    # The snapshot's host copy of REQ[2] is real: dropping the device copy leaves the host run intact.
    index.apply_events(batch("a", 6, BlockRemoved(block_hashes=(REQ[2],), tier="device")))
    assert index.overlaps(REQ)["a"] == TierOverlap(2, 6, 6)


def test_snapshot_older_than_held_batches_asks_again() -> None:
    index = PrefixIndex()
    index.apply_events(batch("a", 0, stored(REQ[:1])))
    index.apply_events(batch("a", 5, stored(REQ[1:2])))  # gap: 1..4 lost
    snap = KvSnapshot(request_id="s", worker_id="a", event_id=2,
                      tier_blocks=(StoredBlock(REQ[0], None, "device"),))
    result = index.load_snapshot("a", snap)
    assert result.needs_snapshot  # batches 3, 4 still missing before the held 5
    snap2 = KvSnapshot(request_id="s2", worker_id="a", event_id=5, tier_blocks=(
        StoredBlock(REQ[0], None, "device"), StoredBlock(REQ[1], REQ[0], "device")))
    assert index.load_snapshot("a", snap2) == type(result)(2, 0, False)
    assert index.overlaps(REQ) == {"a": TierOverlap(2, 2, 2)}


def test_stale_snapshot_ignored_and_unknown_source_gap() -> None:
    index = PrefixIndex()
    for i in range(3):
        index.apply_events(batch("a", i, stored([REQ[i]])))
    stale = KvSnapshot(request_id="s", worker_id="a", event_id=1, tier_blocks=())
    assert index.load_snapshot("a", stale).num_blocks == 0
    assert index.overlaps(REQ) == {"a": TierOverlap(3, 3, 3)}
    # A router that starts while "b" is already at batch 7 must ask for a snapshot.
    assert index.apply_events(batch("b", 7, stored(REQ[:1]))).needs_snapshot


def test_restart_clears_old_blocks() -> None:
    index = PrefixIndex()
    index.apply_events(batch("a", 0, stored(REQ[:3])))
    index.apply_events(batch("a", 1, stored(REQ[3:4])))
    assert index.apply_events(batch("a", 0, stored([REQ[0]]))).action == "restart"
    assert index.overlaps(REQ) == {"a": TierOverlap(1, 1, 1)}


def test_remove_worker_forgets_numbering() -> None:
    index = PrefixIndex()
    index.apply_events(batch("a", 0, stored(REQ[:3])))
    index.remove_worker("a")
    assert index.num_blocks == 0
    assert index.apply_events(batch("a", 0, stored(REQ[:1]))).action == "apply"


def test_kv_events_wire_roundtrip() -> None:
    msg = batch("a", 3, stored([2**64 - 1, 5], parent=2**63), BlockRemoved(block_hashes=(1,), tier="host"),
                AllCleared(tier="disk"))
    assert decode(encode(msg)) == msg
    snap = KvSnapshot(request_id="r", worker_id="a", event_id=-1,
                      tier_blocks=(StoredBlock(2**64 - 1, None, "device"), StoredBlock(3, 2**64 - 1, "disk")))
    assert decode(encode(snap)) == snap


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_approx_index_records_and_expires() -> None:
    clock = FakeClock()
    index = ApproxIndex(ttl_s=10.0, clock=clock)
    index.record("a", REQ[:4])
    index.record("b", REQ[:2])
    assert index.overlaps(REQ) == {"a": TierOverlap(4, 4, 4), "b": TierOverlap(2, 2, 2)}
    assert index.overlaps(REQ, worker_ids=["b"]) == {"b": TierOverlap(2, 2, 2)}
    clock.now += 5
    index.record("b", REQ[:1])  # refreshes b's first block only
    clock.now += 5  # a's and b's first records reach their TTL (expiry is exclusive)
    assert index.overlaps(REQ) == {"b": TierOverlap(1, 1, 1)}
    assert index.expire() == 4 + 1
    assert index.num_blocks == 1
    clock.now += 5
    assert index.overlaps(REQ) == {}
    assert index.expire() == 1 and index.num_blocks == 0


def test_approx_index_remove_worker_and_rerecord() -> None:
    clock = FakeClock()
    index = ApproxIndex(ttl_s=10.0, clock=clock)
    index.record("a", REQ)
    index.remove_worker("a")
    assert index.overlaps(REQ) == {} and index.num_blocks == 0
    clock.now += 1
    index.record("a", REQ[:3])
    clock.now += 9.5  # the removed record's expiry passes; the new one (until 1011) must survive
    assert index.expire() == 0
    assert index.overlaps(REQ) == {"a": TierOverlap(3, 3, 3)}
    with pytest.raises(ValueError):
        ApproxIndex(ttl_s=0)


def _reference_overlap(layout: dict[str, dict[str, set[int]]], shared: set[str], worker: str,
                       hashes: list[int]) -> TierOverlap:
    """The TierOverlap definition, literally: leading blocks each held in tier-or-better (own or shared)."""
    def held(block_hash: int, tiers: tuple[str, ...]) -> bool:
        return any(block_hash in layout.get(src, {}).get(t, set()) for src in {worker} | shared for t in tiers)

    def run(tiers: tuple[str, ...]) -> int:
        n = 0
        while n < len(hashes) and held(hashes[n], tiers):
            n += 1
        return n

    return TierOverlap(run(("device",)), run(("device", "host")), run(("device", "host", "disk")))


@pytest.mark.parametrize("case", range(40))
def test_overlaps_match_definition(case: int) -> None:
    rng = random.Random(case)
    hashes = list(range(1, 13))
    sources = ["a", "b", "c", "kvtier"]
    shared = {"kvtier"} if case % 2 else set()
    tiers = ("device",) if case % 4 == 0 else ("device", "host", "disk")  # device-only and general walks
    index = PrefixIndex(shared_source_ids=shared)
    layout: dict[str, dict[str, set[int]]] = {}
    for src in sources:
        for tier in tiers:
            chosen = {h for h in hashes if rng.random() < (0.9 if src != "kvtier" else 0.3)}
            layout.setdefault(src, {})[tier] = chosen
            index.apply(src, stored(sorted(chosen), tier))
    workers = ["a", "b", "c", "fresh"]
    expected = {w: _reference_overlap(layout, shared, w, hashes) for w in workers}
    got = index.overlaps(hashes, worker_ids=workers)
    assert got == {w: o for w, o in expected.items() if o.disk}


def test_tracker_fail_closed_window() -> None:
    """Registered, restarted under a new epoch, or after a gap: not credited until the snapshot is loaded;
    due_snapshots names each such source once, then again only after retry_s."""
    tracker = EventTracker()
    tracker.expect_snapshot("a")
    assert not tracker.credited("a")
    assert tracker.due_snapshots(now_s=10.0, retry_s=1.0) == ["a"]
    assert tracker.due_snapshots(now_s=10.5, retry_s=1.0) == []
    assert tracker.due_snapshots(now_s=11.0, retry_s=1.0) == ["a"]  # the ask or its answer was lost
    assert tracker.observe("a", 7, epoch=5).action == "awaiting_snapshot"
    assert not tracker.snapshot_fits("a", epoch=6) and tracker.snapshot_fits("a", epoch=5)
    tracker.snapshot_loaded("a", 7, epoch=5)
    assert tracker.credited("a") and tracker.due_snapshots(now_s=20.0, retry_s=1.0) == []
    assert tracker.observe("a", 8, epoch=5).action == "apply"
    # The publisher restarted: batch 0 of a new epoch is a clean start (its engine began empty) ...
    check = tracker.observe("a", 0, epoch=6)
    assert (check.action, check.new_epoch, tracker.credited("a")) == ("restart", True, True)
    # ... a new epoch seen mid-stream is not: its earlier batches were missed.
    check = tracker.observe("a", 3, epoch=9)
    assert (check.action, check.new_epoch, check.needs_snapshot, tracker.credited("a")) == ("gap", True, True, False)
    tracker.snapshot_loaded("a", 3, epoch=9)
    assert tracker.credited("a")
    assert tracker.observe("a", 9, epoch=9).needs_snapshot and not tracker.credited("a")  # a gap


def test_index_fail_closed_until_snapshot() -> None:
    index = PrefixIndex()
    index.apply_events(KvEvents(worker_id="a", event_id=0, epoch=1, events=(stored(REQ[:3]),)))
    assert index.overlaps(REQ) == {"a": TierOverlap(3, 3, 3)}
    index.expect_snapshot("a")  # the worker re-registered
    assert index.overlaps(REQ) == {}
    held = index.apply_events(KvEvents(worker_id="a", event_id=1, epoch=1, events=(stored(REQ[3:4]),)))
    assert held.action == "awaiting_snapshot" and index.overlaps(REQ) == {}
    other_epoch = KvSnapshot(request_id="s", worker_id="a", event_id=0, epoch=2, tier_blocks=())
    assert index.load_snapshot("a", other_epoch).needs_snapshot and index.overlaps(REQ) == {}
    snap = KvSnapshot(request_id="s", worker_id="a", event_id=0, epoch=1,
                      tier_blocks=tuple(StoredBlock(h, None, "device") for h in REQ[:3]))
    result = index.load_snapshot("a", snap)
    assert (result.num_blocks, result.num_replayed, result.needs_snapshot) == (3, 1, False)
    assert index.overlaps(REQ) == {"a": TierOverlap(4, 4, 4)} and index.credited("a")
