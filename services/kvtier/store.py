"""kvtier's synchronous core: index + host pool + disk tier + transfer seam. No sockets (tested directly).

``store`` takes ``TierBlock``s and records the checksum it computes of their bytes itself (the writer's is only
a check of the bytes in transit: a mismatch refuses the block), per model (``model_id``): a lookup never gets another
model's blocks, and a held block is never rewritten (the first writer's bytes stay). ``lookup`` returns the leading run of asked hashes
with their bytes, each re-checked against the checksum recorded at store time: a block whose bytes no
longer match (a corrupt disk slot) is removed and ends the run, so a wrong block is never served.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import structlog

from common.protocol import TierBlock
from services.kvtier.disk import DiskTier
from services.kvtier.index import TierIndex
from services.kvtier.metrics import KvTierMetrics
from common.nixl import NixlHandle
from services.kvtier.pool import HostPool
from common.kvtier.transfer import InlineTransfer, checksum

log = structlog.get_logger(__name__)


class BlockStore:
    def __init__(self, tier_id: str, host_bytes: int, block_bytes: int, disk_bytes: int = 0,
                 disk_dir: Path | None = None, disk_min_hits: int = 1, nixl: NixlHandle | None = None,
                 disk_prefer_nixl: bool = True, metrics: KvTierMetrics | None = None, num_bounce: int = 0) -> None:
        self.tier_id = tier_id
        self.block_bytes = block_bytes
        self.pool = HostPool(host_bytes, block_bytes, nixl, num_bounce if disk_bytes and disk_dir else 0)
        self._next_bounce = 0  # bounce slots are handed out round-robin
        disk_slots = disk_bytes // block_bytes if disk_dir is not None else 0
        self.disk = (DiskTier(disk_dir, tier_id, disk_slots, block_bytes, self.pool, nixl, disk_prefer_nixl)
                     if disk_slots and disk_dir is not None else None)
        self.index = TierIndex(self.pool.num_slots, disk_slots if self.disk else 0, disk_min_hits)
        self.transfer = InlineTransfer()
        self.metrics = metrics or KvTierMetrics()
        self.num_rejected = 0
        self.num_checksum_failures = 0
        self.bytes_in = 0
        self.bytes_out = 0

    def attach_nixl(self, nixl: NixlHandle) -> None:
        """Register the pool (and move disk I/O to NIXL POSIX) once an agent exists; made late because
        importing NIXL (it imports torch) takes seconds and kvtier serves inline bytes meanwhile."""
        if self.pool.attach_nixl(nixl) and self.disk is not None:
            self.disk.attach_nixl(nixl)

    def store(self, blocks: Sequence[TierBlock], model_id: int = 0) -> tuple[int, int, int]:
        """(stored, present, rejected)."""
        stored = present = rejected = stored_bytes = 0
        for block in blocks:
            held = self.index.get(block.block_hash)
            if held is not None and held.model_id == model_id:
                self.index.store(block.block_hash, held.checksum, held.size, model_id)  # refresh only
                present += 1
                continue
            data = self.transfer.incoming(block)
            if data is None or held is not None or len(data) > self.block_bytes:
                rejected += 1  # corrupt in transit, over a slot, or the hash is held for another model
                continue
            # Our own checksum of what we keep: loads are verified against it, whatever the writer claimed.
            plan = self.index.store(block.block_hash, checksum(data), len(data), model_id)
            if plan.slot is None:
                rejected += 1
                continue
            for demote in plan.demotes:  # before the host slot is overwritten
                assert self.disk is not None
                self.disk.write_from_host(demote.host_slot, demote.disk_slot, demote.size)
            self.pool.write(plan.slot, data)
            stored += 1
            stored_bytes += len(data)
        self.num_rejected += rejected
        self.bytes_in += stored_bytes
        self._observe()
        self.metrics.bytes_in.inc(stored_bytes)
        self.metrics.stores.labels(result="stored").inc(stored)
        self.metrics.stores.labels(result="present").inc(present)
        self.metrics.stores.labels(result="rejected").inc(rejected)
        return stored, present, rejected

    def lookup(self, hashes: Sequence[int], max_blocks: int = 0, max_bytes: int = 0,
               model_id: int = 0) -> list[TierBlock]:
        """The leading run of ``hashes`` held here, at most ``max_blocks`` (0: all) and ``max_bytes`` of slots."""
        if max_bytes:
            cap = max(1, max_bytes // self.block_bytes)
            max_blocks = min(max_blocks, cap) if max_blocks else cap
        before = (self.index.counters.hits_host, self.index.counters.hits_disk, self.index.counters.misses)
        out: list[TierBlock] = []
        for entry in self.index.lookup(hashes, max_blocks, model_id):
            if entry.tier == "host":
                data = self.pool.read(entry.slot, entry.size)
            else:
                assert self.disk is not None
                data = self.disk.read(entry.slot, entry.size)
            if checksum(data) != entry.checksum:
                self._checksum_failed(entry)
                break
            out.append(self.transfer.outgoing(entry.block_hash, entry.checksum, entry.tier, data))
        self._count(before, sum(b.size for b in out))
        return out

    def lookup_slots(self, hashes: Sequence[int], max_blocks: int = 0, max_inline_bytes: int = 0,
                     model_id: int = 0) -> tuple[list[TierBlock], bool]:
        """Like ``lookup``, but host blocks come back as their pool slots (the worker READs them with NIXL and
        checks their checksums itself). Disk blocks are read into bounce slots of the pool and come back as
        those (at most ``pool.num_bounce`` per call: the worker READs them before asking again; a later call may
        reuse them, which its checksums catch), or inline when the pool has no bounce slots or is not
        registered, at most ``max_inline_bytes`` of them (0: no cap). Returns (blocks, truncated: stopped at a
        cap, not at the end of the run)."""
        bounce = self.pool.num_bounce if self.pool.registered else 0
        run = self.index.peek(hashes, max_blocks, model_id)
        num, inline, num_disk = 0, 0, 0
        for entry in run:
            if entry.tier == "disk":
                if bounce and num_disk == bounce:
                    break
                if not bounce and max_inline_bytes and num and inline + entry.size > max_inline_bytes:
                    break
                inline += entry.size
                num_disk += 1
            num += 1
        truncated = num < len(run) or (bool(max_blocks) and num == max_blocks and len(hashes) > num)
        before = (self.index.counters.hits_host, self.index.counters.hits_disk, self.index.counters.misses)
        out: list[TierBlock] = []
        for entry in self.index.lookup(hashes, num, model_id):  # num is 0 only when nothing is held: counts the miss
            if entry.tier == "host":
                out.append(TierBlock(block_hash=entry.block_hash, checksum=entry.checksum, size=entry.size,
                                     tier="host", slot=entry.slot))
                continue
            assert self.disk is not None
            if bounce:
                slot = self.pool.num_slots + self._next_bounce
                self._next_bounce = (self._next_bounce + 1) % bounce
                self.disk.read_into(entry.slot, slot, entry.size)
                data: bytes | memoryview = self.pool.view(slot, entry.size)
            else:
                data = self.disk.read(entry.slot, entry.size)
            if checksum(data) != entry.checksum:
                self._checksum_failed(entry)
                truncated = False
                break
            out.append(TierBlock(block_hash=entry.block_hash, checksum=entry.checksum, size=entry.size,
                                 tier="disk", slot=slot) if bounce else
                       self.transfer.outgoing(entry.block_hash, entry.checksum, entry.tier, data))  # type: ignore[arg-type]
        self._count(before, sum(b.size for b in out))
        return out, truncated

    def _checksum_failed(self, entry) -> None:
        log.error("checksum_mismatch", block_hash=entry.block_hash, tier=entry.tier, slot=entry.slot)
        self.num_checksum_failures += 1
        self.metrics.checksum_failures.labels(tier=entry.tier).inc()
        self.index.remove(entry.block_hash)

    def _count(self, before: tuple[int, int, int], num_bytes: int) -> None:
        self.bytes_out += num_bytes
        c = self.index.counters
        self.metrics.hits.labels(tier="host").inc(c.hits_host - before[0])
        self.metrics.hits.labels(tier="disk").inc(c.hits_disk - before[1])
        self.metrics.misses.inc(c.misses - before[2])
        self.metrics.bytes_out.inc(num_bytes)
        self._observe()

    def _observe(self) -> None:
        m, c = self.metrics, self.index.counters
        m.occupancy.labels(tier="host").set(self.index.num_used("host"))
        m.occupancy.labels(tier="disk").set(self.index.num_used("disk"))
        m.set_evictions(c.evictions_host, c.evictions_disk, c.demotions)

    def close(self) -> None:
        if self.disk is not None:
            self.disk.close()
        self.pool.close()
