"""kvtier's block index: hash -> (tier, slot, checksum, size), LRU per tier, frequency filter for disk.

Pure bookkeeping (no bytes, no I/O), so eviction is tested with exact expectations. The index owns slot
numbers of both tiers; the service moves the bytes. ``store`` returns a plan the caller executes IN ORDER:
first every ``Demote`` (copy the host slot to the disk slot: the host slot is reused right after), then the
new block's bytes into ``plan.slot``.

Eviction: a new block goes to host. When host is full, its least recently used block leaves: to disk if it
was hit (looked up) at least ``disk_min_hits`` times and a disk tier exists, else it is dropped (one-off
prompts never reach disk). When disk is full, its LRU block is dropped. A lookup hit refreshes a block in
its tier's LRU. Every change is recorded as a KV event (``BlockStored``/``BlockRemoved`` with tier
"host"/"disk") for the router.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from common.protocol import BlockRemoved, BlockStored, KvEvent, Tier


@dataclass(slots=True)
class Entry:
    block_hash: int
    tier: Tier
    slot: int
    checksum: int
    size: int
    hits: int = 0
    # The model it is KV of (TierStore.model_id): another model's lookup of the same hash is a miss.
    model_id: int = 0


@dataclass(frozen=True, slots=True)
class Demote:
    """Copy ``size`` bytes of host slot ``host_slot`` to disk slot ``disk_slot`` (before the host slot is reused)."""

    block_hash: int
    host_slot: int
    disk_slot: int
    size: int


@dataclass(frozen=True, slots=True)
class StorePlan:
    # Host slot to write the new block into; None: nothing to write (already held, or no room).
    slot: int | None
    demotes: tuple[Demote, ...] = ()
    present: bool = False


@dataclass(slots=True)
class IndexCounters:
    stored: int = 0
    present: int = 0
    hits_host: int = 0
    hits_disk: int = 0
    misses: int = 0
    evictions_host: int = 0  # host blocks dropped (not demoted)
    evictions_disk: int = 0
    demotions: int = 0
    removed: int = 0  # removed on request (e.g. a checksum failure)


@dataclass(slots=True)
class _Tier:
    name: Tier
    num_slots: int
    lru: OrderedDict[int, Entry] = field(default_factory=OrderedDict)  # hash -> entry, oldest first
    free: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.free = list(range(self.num_slots - 1, -1, -1))  # pop() hands out slot 0 first

    def take_slot(self) -> int | None:
        return self.free.pop() if self.free else None


class TierIndex:
    def __init__(self, host_slots: int, disk_slots: int = 0, disk_min_hits: int = 1) -> None:
        if host_slots < 0 or disk_slots < 0 or disk_min_hits < 0:
            raise ValueError("slot counts and disk_min_hits must be >= 0")
        self.disk_min_hits = disk_min_hits
        self._host = _Tier("host", host_slots)
        self._disk = _Tier("disk", disk_slots)
        self._entries: dict[int, Entry] = {}
        self._events: list[KvEvent] = []
        self.counters = IndexCounters()

    # ------------------------------------------------------------------------------------------ queries

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._entries

    def get(self, block_hash: int) -> Entry | None:
        return self._entries.get(block_hash)

    def num_used(self, tier: Tier) -> int:
        return len(self._tier(tier).lru)

    def num_slots(self, tier: Tier) -> int:
        return self._tier(tier).num_slots

    def hashes(self, tier: Tier) -> list[int]:
        """Hashes held in ``tier``, least recently used first."""
        return list(self._tier(tier).lru)

    def snapshot(self) -> list[tuple[int, Tier]]:
        return [(h, e.tier) for h, e in self._entries.items()]

    # ------------------------------------------------------------------------------------------ changes

    def store(self, block_hash: int, checksum: int, size: int, model_id: int = 0) -> StorePlan:
        """Place a new block in host (evicting as needed). A held block is refreshed, not rewritten (the first
        writer's bytes and our checksum of them stay); one held for another model is refused (no slot)."""
        entry = self._entries.get(block_hash)
        if entry is not None and entry.model_id != model_id:
            return StorePlan(slot=None)
        if entry is not None:
            self._tier(entry.tier).lru.move_to_end(block_hash)
            self.counters.present += 1
            return StorePlan(slot=None, present=True)
        host = self._host
        if host.num_slots == 0:
            return StorePlan(slot=None)
        demotes: list[Demote] = []
        slot = host.take_slot()
        if slot is None:
            slot = self._evict_host(demotes)
        entry = Entry(block_hash, "host", slot, checksum, size, model_id=model_id)
        self._entries[block_hash] = entry
        host.lru[block_hash] = entry
        self._events.append(BlockStored(block_hashes=(block_hash,), parent_hash=None, tier="host"))
        self.counters.stored += 1
        return StorePlan(slot=slot, demotes=tuple(demotes))

    def lookup(self, hashes: Sequence[int], max_blocks: int = 0, model_id: int = 0) -> list[Entry]:
        """The leading run of ``hashes`` held in any tier for ``model_id`` (at most ``max_blocks``, 0 = all);
        counts hits."""
        run: list[Entry] = []
        for block_hash in hashes:
            if max_blocks and len(run) >= max_blocks:
                break
            entry = self._entries.get(block_hash)
            if entry is None or entry.model_id != model_id:
                break
            entry.hits += 1
            self._tier(entry.tier).lru.move_to_end(block_hash)
            if entry.tier == "host":
                self.counters.hits_host += 1
            else:
                self.counters.hits_disk += 1
            run.append(entry)
        if not run and hashes:
            self.counters.misses += 1
        return run

    def peek(self, hashes: Sequence[int], max_blocks: int = 0, model_id: int = 0) -> list[Entry]:
        """The leading run ``lookup`` would return, without counting hits or touching the LRU order."""
        run: list[Entry] = []
        for block_hash in hashes:
            entry = self._entries.get(block_hash)
            if entry is None or entry.model_id != model_id or (max_blocks and len(run) >= max_blocks):
                break
            run.append(entry)
        return run

    def remove(self, block_hash: int) -> Entry | None:
        """Forget a block (its bytes failed their checksum); its slot is free again."""
        entry = self._entries.pop(block_hash, None)
        if entry is None:
            return None
        tier = self._tier(entry.tier)
        del tier.lru[block_hash]
        tier.free.append(entry.slot)
        self._events.append(BlockRemoved(block_hashes=(block_hash,), tier=entry.tier))
        self.counters.removed += 1
        return entry

    def clear(self) -> None:
        for block_hash in list(self._entries):
            self.remove(block_hash)

    def drain_events(self) -> list[KvEvent]:
        """Events since the previous call, oldest first; runs of one kind and tier are merged."""
        merged: list[KvEvent] = []
        for event in self._events:
            last = merged[-1] if merged else None
            if type(last) is type(event) and last.tier == event.tier:  # type: ignore[union-attr]
                if isinstance(event, BlockStored):
                    merged[-1] = BlockStored(block_hashes=last.block_hashes + event.block_hashes,  # type: ignore[union-attr]
                                             parent_hash=None, tier=event.tier)
                    continue
                if isinstance(event, BlockRemoved):
                    merged[-1] = BlockRemoved(block_hashes=last.block_hashes + event.block_hashes,  # type: ignore[union-attr]
                                              tier=event.tier)
                    continue
            merged.append(event)
        self._events = []
        return merged

    # ---------------------------------------------------------------------------------------- internals

    def _tier(self, tier: Tier) -> _Tier:
        if tier == "host":
            return self._host
        if tier == "disk":
            return self._disk
        raise ValueError(f"kvtier holds no {tier!r} tier")

    def _evict_host(self, demotes: list[Demote]) -> int:
        """Free one host slot by evicting the LRU host block (to disk if it earned it). Returns the slot."""
        host = self._host
        block_hash, victim = host.lru.popitem(last=False)
        slot = victim.slot
        self._events.append(BlockRemoved(block_hashes=(block_hash,), tier="host"))
        if self._disk.num_slots and victim.hits >= self.disk_min_hits:
            disk_slot = self._disk.take_slot()
            if disk_slot is None:
                disk_slot = self._evict_disk()
            demotes.append(Demote(block_hash, slot, disk_slot, victim.size))
            victim.tier, victim.slot = "disk", disk_slot
            self._disk.lru[block_hash] = victim
            self._events.append(BlockStored(block_hashes=(block_hash,), parent_hash=None, tier="disk"))
            self.counters.demotions += 1
        else:
            del self._entries[block_hash]
            self.counters.evictions_host += 1
        return slot

    def _evict_disk(self) -> int:
        block_hash, victim = self._disk.lru.popitem(last=False)
        del self._entries[block_hash]
        self._events.append(BlockRemoved(block_hashes=(block_hash,), tier="disk"))
        self.counters.evictions_disk += 1
        return victim.slot


def stored_hashes(events: Iterable[KvEvent], tier: Tier) -> list[int]:
    """Hashes stored in ``tier`` by ``events`` (test helper)."""
    return [h for e in events if isinstance(e, BlockStored) and e.tier == tier for h in e.block_hashes]
