"""Worker side of the kvtier connector: put planned tier blocks into vLLM's KV cache, verified.

Two paths (``vllm_tier_connector`` picks per load): ``load_nixl`` READs blocks from kvtier's registered pool
with NIXL (``tier_nixl``; host blocks in their slots, disk blocks in bounce slots kvtier read them into) and
checks every block's xxh3 in place; ``load_inline`` takes the bytes in the lookup reply (checked by the client)
and copies them in. Both return how many LEADING planned blocks are good: the rest are vLLM's to recompute.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

import structlog

from common.protocol import TierBlock
from services.worker.engines.vllm.tier.layout import KvLayout
from services.worker.engines.vllm.tier.mover import TierMover
from services.worker.engines.vllm.tier.nixl import NixlOnboarder
from services.worker.engines.vllm.tier.plan import BlockPlan
from common.kvtier.sync_client import SyncTierClient
from services.worker.tier_load_log import slowest_tier

log = structlog.get_logger(__name__)


class TierLoader:
    def __init__(self, layout: KvLayout, client: SyncTierClient, nixl: NixlOnboarder | None,
                 fetch_timeout_s: float, mover: TierMover | None = None) -> None:
        self.layout = layout
        # Host bytes onto the KV cache's device (CUDA: pinned, on a side stream; CPU: as they are).
        self.mover = mover or TierMover(layout.device)
        self.client = client
        self.nixl = nixl
        self.fetch_timeout_s = fetch_timeout_s
        self._checked_s = -1e9  # last time kvtier was asked for its NIXL pool
        # ms per phase of the last NIXL load, and how many blocks it READ (for the load's log line).
        self.phases: dict[str, float] = {}
        # The slowest tier the last load's blocks came from (its TierLoadSample's tier).
        self.last_tier = "host"

    def load_inline(self, plan: BlockPlan) -> int:
        layout = self.layout
        got = self.client.fetch(plan.block_hashes, layout.block_bytes, self._fetch_timeout_s(plan))
        self.last_tier = self.client.last_fetch_tier
        if got:
            data = self.mover.stage(got, layout.block_bytes)
            layout.unpack(plan.block_ids[:len(got)], self.mover.to_device(data))
        return len(got)

    def load_nixl(self, plan: BlockPlan) -> int:
        """Blocks in pool slots by NIXL READ, inline ones copied; the leading run whose checksums hold. One
        lookup and READ per kvtier reply (a reply's bounce slots may be reused by the next one)."""
        layout = self.layout
        deadline = time.monotonic() + self._fetch_timeout_s(plan)
        phases = {"lookup_ms": 0.0, "read_ms": 0.0, "verify_ms": 0.0, "num_read": 0}
        done = 0
        tiers: list[str] = []
        while done < len(plan.block_ids) and time.monotonic() < deadline:
            t0 = time.perf_counter()
            blocks, agent, truncated = self.client.lookup_slots(plan.block_hashes[done:], layout.block_bytes,
                                                                deadline - time.monotonic())
            phases["lookup_ms"] += (time.perf_counter() - t0) * 1e3
            num_ok = self._place(plan.block_ids[done:done + len(blocks)], blocks, agent, phases)
            tiers += [b.tier for b in blocks[:num_ok]]
            done += num_ok
            if num_ok < len(blocks) or not truncated:
                break
        # ms per phase, and how many blocks were READ (the rest came inline), for the load's log line.
        self.phases = {k: round(v, 3) for k, v in phases.items()}
        self.last_tier = slowest_tier(tiers)
        return done

    def _place(self, block_ids: Sequence[int], blocks: list[TierBlock], agent: str, phases: dict[str, float]) -> int:
        """READ / copy ``blocks`` into ``block_ids``, then check them; how many leading ones are good."""
        layout, nixl = self.layout, self.nixl
        assert nixl is not None
        if agent != nixl.peer_name and any(b.slot >= 0 for b in blocks):
            # kvtier restarted (another agent, another pool): learn the new one, or use none of these slots.
            nixl.disconnect()
            self._checked_s = -1e9
            if not self.nixl_ready() or agent != nixl.peer_name:
                blocks = list(itertools.takewhile(lambda b: b.slot < 0, blocks))
        pairs = [(bid, b.slot) for bid, b in zip(block_ids, blocks) if b.slot >= 0]
        read_ok = True
        t1 = time.perf_counter()
        if pairs:
            try:
                nixl.read([bid for bid, _ in pairs], [slot for _, slot in pairs])
            except Exception as exc:  # kvtier gone or restarted: inline until it offers its pool again
                log.warning("kvtier_nixl_read_failed", error=repr(exc), num_blocks=len(pairs))
                nixl.disconnect()
                read_ok = False
        t2 = time.perf_counter()
        inline = [(bid, b.data) for bid, b in zip(block_ids, blocks) if b.slot < 0]
        if inline:
            data = self.mover.stage([d for _, d in inline], layout.block_bytes)
            layout.unpack([bid for bid, _ in inline], self.mover.to_device(data))
        num_ok = len(blocks)
        for i, (bid, block) in enumerate(zip(block_ids, blocks)):
            if block.slot >= 0 and not (read_ok and nixl.checksum(bid) == block.checksum):
                log.warning("kvtier_block_bad_after_read", block_hash=block.block_hash, slot=block.slot)
                num_ok = i
                break
        phases["read_ms"] += (t2 - t1) * 1e3
        phases["verify_ms"] += (time.perf_counter() - t2) * 1e3
        phases["num_read"] += len(pairs)
        return num_ok

    def _fetch_timeout_s(self, plan: BlockPlan) -> float:
        """The engine step waits for a load: 0.5 s plus the blocks' bytes at 0.5 GB/s (a slow kvtier costs a
        recompute soon), at most ``fetch_timeout_s``."""
        num_bytes = len(plan.block_ids) * self.layout.block_bytes
        return min(self.fetch_timeout_s, 0.5 + num_bytes / 0.5e9)

    def nixl_ready(self, stats_timeout_s: float = 1.0) -> bool:
        """NIXL READs possible: our agent works and kvtier's pool is known (asked again every 2 s until it is)."""
        nixl = self.nixl
        if nixl is None or not nixl.usable:
            return False
        if not nixl.connected and time.monotonic() - self._checked_s > 2.0:
            self._checked_s = time.monotonic()
            stats = self.client.stats(stats_timeout_s)
            if stats is not None and stats.block_bytes != self.layout.block_bytes:
                # kvtier's slots are sized for another model or dtype: it refuses bigger blocks; smaller ones
                # would fit but never match (every load checks the size). Say so: nothing will be shared.
                log.warning("kvtier_block_bytes_mismatch", kvtier_block_bytes=stats.block_bytes,
                            block_bytes=self.layout.block_bytes)
            try:
                if stats is not None:
                    nixl.connect(stats)
            except Exception as exc:  # a peer NIXL cannot reach: inline bytes still work
                log.warning("kvtier_nixl_connect_failed", error=repr(exc))
                nixl.disconnect()
        return nixl.connected

