"""Prefix index: which source holds which chained block hash, in which tier (docs/architecture.md#contracts).

Chained hashes name whole prefixes, so a flat map hash -> holders is enough (no radix tree): a request's
overlap on a worker is how far its hash list stays held there. Holders are bitmasks, one bit per source,
one map per tier, so the walk over a request's blocks is a few dict lookups and integer ANDs per block for
any number of workers. ``parent_hash`` is not needed for that and is ignored.

Shared sources (kvtier) hold blocks every worker can load: their blocks count for every worker.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from common.protocol import AllCleared, BlockRemoved, BlockStored, KvEvent, KvEvents, KvSnapshot, Tier
from services.router.event_tracker import EventCheck, EventTracker

TIERS: tuple[Tier, ...] = ("device", "host", "disk")  # best (cheapest to reuse) first
_LEVEL: dict[str, int] = {tier: level for level, tier in enumerate(TIERS)}
# Bit 0 stands for "a worker with no blocks of its own": it only ever holds shared blocks.
_NOBODY = 1


@dataclass(frozen=True, slots=True)
class TierOverlap:
    """A request's reusable LEADING blocks on one worker, cumulative by tier (device <= host <= disk).

    ``device``: the longest run of the request's first blocks that are each on the worker's device.
    ``host``: the same, each block on device OR host. ``disk``: each block in any tier. The worker reuses
    the first ``device`` blocks in place, loads the next ``host - device`` from host memory and the next
    ``disk - host`` from disk; the run stops at the first block held nowhere.
    """

    device: int = 0
    host: int = 0
    disk: int = 0
    # What these blocks save in prefill seconds, per worker: services/router/tier_credit.py.


NO_OVERLAP = TierOverlap()


@dataclass(frozen=True, slots=True)
class SnapshotLoad:
    num_blocks: int  # (hash, tier) entries loaded for the source
    num_replayed: int  # held batches applied on top of the snapshot
    # The replay found another gap (or the snapshot was stale): the caller asks for a snapshot again.
    needs_snapshot: bool


class PrefixIndex:
    def __init__(self, shared_source_ids: Iterable[str] = (), max_held_batches: int = 1024) -> None:
        # Per tier level: hash -> OR of the bits of the sources holding it there.
        self._holders: tuple[dict[int, int], ...] = tuple({} for _ in TIERS)
        # Per source, per tier level: the hashes it holds (for removal, clearing and counts).
        self._held: dict[str, tuple[set[int], ...]] = {}
        self._bit: dict[str, int] = {}
        self._free_bits: list[int] = []
        self._next_bit = _NOBODY << 1
        self._shared_ids = set(shared_source_ids)
        self._shared_mask = 0
        self._num_blocks = 0
        self._default: tuple[dict[str, int], int] | None = None  # _default_bits cache
        self.tracker = EventTracker()
        # Batches that arrived after a gap, replayed once the snapshot is loaded (bounded per source).
        self._held_batches: dict[str, list[KvEvents]] = {}
        self._max_held_batches = max_held_batches

    # ------------------------------------------------------------------------------------------ queries

    @property
    def num_blocks(self) -> int:
        """(source, tier, hash) entries held, over all sources."""
        return self._num_blocks

    def source_num_blocks(self, source_id: str) -> int:
        return sum(map(len, self._held.get(source_id, ())))

    def sources(self) -> list[str]:
        return list(self._held)

    def source_run(self, source_id: str, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` that ``source_id`` holds, in any tier."""
        held = self._held.get(source_id, ())
        n = 0
        while n < len(hashes) and any(hashes[n] in level for level in held):
            n += 1
        return n

    def overlaps(self, hashes: Sequence[int], worker_ids: Iterable[str] | None = None) -> dict[str, TierOverlap]:
        """TierOverlap per worker for a request's chained hashes; workers that can reuse nothing are left out.

        ``worker_ids``: the workers to consider (default: every non-shared source in the index); a worker
        unknown to the index can still reuse shared blocks.
        """
        if worker_ids is None:
            bits, start = self._default_bits()
        else:
            bit_of = self._bit
            bits = {w: bit_of.get(w, _NOBODY) for w in worker_ids}
            start = _NOBODY
            for bit in bits.values():
                start |= bit
        run_d, run_h, run_k = self._walk(hashes, start)
        result: dict[str, TierOverlap] = {}
        if not run_k:
            return result
        made: dict[tuple[int, int, int], TierOverlap] = {}  # workers with equal runs share one object
        for worker_id, bit in bits.items():
            disk = run_k.get(bit)
            if disk:
                key = (run_d.get(bit, 0), run_h.get(bit, 0), disk)
                overlap = made.get(key)
                if overlap is None:
                    overlap = made[key] = TierOverlap(*key)
                result[worker_id] = overlap
        return result

    def _default_bits(self) -> tuple[dict[str, int], int]:
        """(worker -> bit, OR of them and _NOBODY) over every non-shared source; cached until sources change."""
        if self._default is None:
            bits = {w: bit for w, bit in self._bit.items() if w not in self._shared_ids}
            start = _NOBODY
            for bit in bits.values():
                start |= bit
            self._default = (bits, start)
        return self._default

    def _walk(self, hashes: Sequence[int], start: int) -> tuple[dict[int, int], ...]:
        """Run length per bit and tier level: how many leading hashes stay held (tier or better) by that bit."""
        if not self._shared_mask and not self._holders[1] and not self._holders[2]:
            runs = self._walk_device_only(hashes, start)
            return (runs, runs, runs)
        device, host, disk = (h.get for h in self._holders)
        shared, every = self._shared_mask, start
        alive_d = alive_h = alive_k = start
        runs: tuple[dict[int, int], ...] = ({}, {}, {})
        n = 0
        for block_hash in hashes:
            d = device(block_hash, 0)
            if d & shared:
                d = every
            # Look a slower tier up only for alive bits the faster tiers do not already cover: with the
            # prefix on device (or shared on host) most blocks cost one or two lookups, not three.
            h = d
            host_looked_up = alive_h & ~h
            if host_looked_up:
                h |= host(block_hash, 0)
                if h & shared:
                    h = every
            k = h
            if alive_k & ~k:
                # Host holders count at the disk level too: add them if the host step was skipped.
                k |= disk(block_hash, 0) if host_looked_up else disk(block_hash, 0) | host(block_hash, 0)
                if k & shared:
                    k = every
            # Sets only shrink and alive_d <= alive_h <= alive_k, so an empty alive_k ends every run.
            if alive_k & k != alive_k:
                _close(runs[2], alive_k & ~k, n)
                alive_k &= k
            if alive_h & h != alive_h:
                _close(runs[1], alive_h & ~h, n)
                alive_h &= h
            if alive_d & d != alive_d:
                _close(runs[0], alive_d & ~d, n)
                alive_d &= d
            if not alive_k:
                return runs
            n += 1
        _close(runs[0], alive_d, n)
        _close(runs[1], alive_h, n)
        _close(runs[2], alive_k, n)
        return runs

    def _walk_device_only(self, hashes: Sequence[int], alive: int) -> dict[int, int]:
        """``_walk`` when nothing is off device (the common case): a third of the lookups."""
        device = self._holders[0].get
        runs: dict[int, int] = {}
        n = 0
        for block_hash in hashes:
            d = device(block_hash, 0)
            if alive & d != alive:
                _close(runs, alive & ~d, n)
                alive &= d
                if not alive:
                    return runs
            n += 1
        _close(runs, alive, n)
        return runs

    # ------------------------------------------------------------------------------------------ updates

    def apply(self, source_id: str, event: KvEvent) -> None:
        """Apply one event, unconditionally (no event-number check: see ``apply_events``)."""
        match event:
            case BlockStored(block_hashes=hashes, tier=tier):
                self._store(source_id, hashes, _LEVEL[tier])
            case BlockRemoved(block_hashes=hashes, tier=tier):
                self._remove(source_id, hashes, _LEVEL[tier])
            case AllCleared(tier=tier):
                held = self._held.get(source_id)
                if held is not None:
                    level = _LEVEL[tier]
                    self._remove(source_id, list(held[level]), level)

    def apply_events(self, batch: KvEvents) -> EventCheck:
        """Apply a batch if it is next in order; hold it after a gap. ``needs_snapshot`` says when to ask."""
        source_id = batch.worker_id
        check = self.tracker.observe(source_id, batch.event_id, batch.epoch)
        if check.new_epoch:
            self._held_batches.pop(source_id, None)  # the old epoch's: superseded by the restart
        if check.action == "gap" or check.new_epoch:
            self._clear_source(source_id)  # fail closed: no credit for a view known to be incomplete
        match check.action:
            case "apply":
                pass
            case "restart":
                self._clear_source(source_id)
            case "duplicate":
                return check
            case "gap" | "awaiting_snapshot":
                held = self._held_batches.setdefault(source_id, [])
                held.append(batch)
                if len(held) > self._max_held_batches:
                    del held[0]  # the replay then finds a gap and asks again
                return check
        for event in batch.events:
            self.apply(source_id, event)
        return check

    def load_snapshot(self, source_id: str, snapshot: KvSnapshot) -> SnapshotLoad:
        """Replace everything ``source_id`` holds with the snapshot, then replay batches held since the gap."""
        last = self.tracker.last_event_id(source_id)
        awaiting = self.tracker.awaiting_snapshot(source_id)
        if last is not None and not awaiting and (snapshot.event_id < last
                                                  or not self.tracker.snapshot_fits(source_id, snapshot.epoch)):
            return SnapshotLoad(0, 0, needs_snapshot=False)  # older than what we applied: a late duplicate
        if not self.tracker.snapshot_fits(source_id, snapshot.epoch):
            return SnapshotLoad(0, 0, needs_snapshot=True)  # the source restarted since: ask the new one
        self._clear_source(source_id)
        by_level: tuple[list[int], ...] = ([], [], [])
        for block in snapshot.tier_blocks:
            by_level[_LEVEL[block.tier]].append(block.block_hash)
        for level, hashes in enumerate(by_level):
            if hashes:
                self._store(source_id, hashes, level)
        self.tracker.snapshot_loaded(source_id, snapshot.event_id, snapshot.epoch)
        held = sorted(self._held_batches.pop(source_id, []), key=lambda b: b.event_id)
        num_replayed = 0
        for batch in held:
            check = self.apply_events(batch)
            num_replayed += check.action in ("apply", "restart")
        return SnapshotLoad(len(snapshot.tier_blocks), num_replayed, self.tracker.awaiting_snapshot(source_id))

    def expect_snapshot(self, source_id: str) -> None:
        """A source (re)registered: forget what it held and credit it nothing until its snapshot is loaded."""
        self._clear_source(source_id)
        self._held_batches.pop(source_id, None)
        self.tracker.expect_snapshot(source_id)

    def credited(self, source_id: str) -> bool:
        return self.tracker.credited(source_id)

    def remove_worker(self, source_id: str) -> None:
        """Forget a source entirely: its blocks, its event numbering and any held batches."""
        self._clear_source(source_id)
        self._held.pop(source_id, None)
        bit = self._bit.pop(source_id, None)
        self._default = None
        if bit is not None:
            self._free_bits.append(bit)
            self._shared_mask &= ~bit
        self.tracker.forget(source_id)
        self._held_batches.pop(source_id, None)

    def mark_shared(self, source_id: str) -> None:
        """Blocks of this source (kvtier) count for every worker."""
        self._shared_ids.add(source_id)
        self._default = None
        bit = self._bit.get(source_id)
        if bit is not None:
            self._shared_mask |= bit

    # ---------------------------------------------------------------------------------------- internals

    def _source_bit(self, source_id: str) -> int:
        bit = self._bit.get(source_id)
        if bit is None:
            if self._free_bits:
                bit = self._free_bits.pop()
            else:
                bit, self._next_bit = self._next_bit, self._next_bit << 1
            self._bit[source_id] = bit
            self._default = None
            self._held[source_id] = tuple(set() for _ in TIERS)
            if source_id in self._shared_ids:
                self._shared_mask |= bit
        return bit

    def _store(self, source_id: str, hashes: Iterable[int], level: int) -> None:
        bit = self._source_bit(source_id)
        held = self._held[source_id][level]
        holders = self._holders[level]
        get = holders.get
        before = len(held)
        for block_hash in hashes:
            if block_hash not in held:
                held.add(block_hash)
                holders[block_hash] = get(block_hash, 0) | bit
        self._num_blocks += len(held) - before

    def _remove(self, source_id: str, hashes: Iterable[int], level: int) -> None:
        bit = self._bit.get(source_id)
        if bit is None:
            return
        held = self._held[source_id][level]
        holders = self._holders[level]
        keep = ~bit
        before = len(held)
        for block_hash in hashes:
            if block_hash in held:
                held.discard(block_hash)
                mask = holders[block_hash] & keep
                if mask:
                    holders[block_hash] = mask
                else:
                    del holders[block_hash]
        self._num_blocks -= before - len(held)

    def _clear_source(self, source_id: str) -> None:
        held = self._held.get(source_id)
        if held is not None:
            for level, hashes in enumerate(held):
                self._remove(source_id, list(hashes), level)


def _close(runs: dict[int, int], bits: int, length: int) -> None:
    """Record ``length`` as the run of every bit set in ``bits``."""
    if not length:
        return  # a missing run reads as 0
    while bits:
        low = bits & -bits
        runs[low] = length
        bits ^= low
