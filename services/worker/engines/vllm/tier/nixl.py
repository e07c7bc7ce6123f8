"""Onboarding by NIXL READ: kvtier's registered host pool -> this worker's registered KV cache, then checksums.

A tier block in pool slot ``s`` holds, at offset ``part_offset[p]``, the slab of KV part ``p`` (``kv_layout``:
one part per layer, or K and V per layer). Both sides get one prepared descriptor list, made once:

* local (our KV cache): index ``p * num_blocks + b`` = part ``p``'s slab of block id ``b``;
* remote (the pool): index ``s * num_parts + p`` = slot ``s``'s slab of part ``p``.

A load of blocks [(block id, slot)] is then one ``make_prepped_xfer("READ")`` of ``num_blocks * num_parts``
descriptors (one slab each; a pool slot is block-major and the KV cache part-major, so adjacent blocks cannot
be coalesced into one descriptor). kvtier does not pin slots: a slot evicted and rewritten while we read it is
caught by the checksum, verified here over the slabs just written (xxh3_64 streamed over the parts in packing
order = the checksum of the packed block). A failed block is recomputed by vLLM, never used.

NIXL per docs/architecture.md#nixl-facts: our own agent (made in vLLM's worker process, after its fork), no progress thread, UCX with
``ucx_error_handling_mode=none`` (a dead kvtier is noticed by the READ's timeout), no notifications.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import structlog
import torch
import xxhash

from common.protocol import TierStats
from common.nixl import NixlHandle, make_nixl_agent, run_xfer
from services.worker.engines.vllm.tier.layout import KvLayout

log = structlog.get_logger(__name__)


class NixlOnboarder:
    def __init__(self, layout: KvLayout, name: str, xfer_timeout_s: float = 5.0) -> None:
        self.layout = layout
        self.xfer_timeout_s = xfer_timeout_s
        self._nixl: NixlHandle | None = make_nixl_agent(f"{name}-tier-{os.getpid()}", backends=("UCX",))
        self._regs: list[object] = []
        self._local = None  # prepared dlist handle of our KV cache
        self._remote = None  # prepared dlist handle of kvtier's pool
        self._peer = ""
        self._pool_key: tuple[str, int] = ("", 0)
        self._num_slots = 0
        if self._nixl is None:
            return
        agent = self._nixl.agent
        descs = []
        for part in layout.parts:
            region = part.shape[0] * part.stride(0) * part.element_size()
            reg = agent.register_memory([(part.data_ptr(), region, 0, "")], "DRAM")  # type: ignore[attr-defined]
            self._regs.append(reg)
            row, slab = part.stride(0) * part.element_size(), part[0].numel() * part.element_size()
            descs += [(part.data_ptr() + b * row, slab, 0) for b in range(layout.num_blocks)]
        self._local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", descs, "DRAM")  # type: ignore[attr-defined]
        # uint8 numpy views [num_blocks, slab bytes] of each part, made once: slicing a row per block costs
        # ~0.2 us where a torch view + .numpy() costs ~8 us (744 slabs for 2,000 tokens of a 12-layer model).
        self._rows = [_byte_rows(part) for part in layout.parts]

    @property
    def usable(self) -> bool:
        return self._local is not None

    @property
    def connected(self) -> bool:
        return self._remote is not None

    @property
    def peer_name(self) -> str:
        """kvtier's agent whose pool we READ ("" when not connected)."""
        return self._pool_key[0]

    def connect(self, stats: TierStats) -> bool:
        """Know kvtier's pool (again, if kvtier restarted); False when it offers no NIXL path."""
        if not self.usable or not stats.nixl or not stats.nixl_metadata or stats.block_bytes != self.layout.block_bytes:
            return False
        if (stats.nixl_agent, stats.pool_addr) == self._pool_key and self.connected:
            return True
        self.disconnect()
        agent = self._nixl.agent  # type: ignore[union-attr]
        self._peer = agent.add_remote_agent(stats.nixl_metadata)  # type: ignore[attr-defined]
        offsets, offset = [], 0
        for size in self.layout.part_bytes:
            offsets.append(offset)
            offset += size
        num_slots = stats.pool_slots or stats.host_slots
        descs = [(stats.pool_addr + s * stats.block_bytes + off, size, 0)
                 for s in range(num_slots) for off, size in zip(offsets, self.layout.part_bytes)]
        self._remote = agent.prep_xfer_dlist(self._peer, descs, "DRAM")  # type: ignore[attr-defined]
        self._num_slots = num_slots
        self._pool_key = (stats.nixl_agent, stats.pool_addr)
        log.info("kvtier_nixl_connected", peer=self._peer, pool_slots=num_slots, num_descs=len(descs))
        return True

    def read(self, block_ids: Sequence[int], slots: Sequence[int]) -> None:
        """READ pool ``slots[i]`` into KV block ``block_ids[i]``; raises on failure or timeout."""
        assert self._nixl is not None and self._remote is not None
        num_parts = len(self.layout.parts)
        if any(not 0 <= s < self._num_slots for s in slots):
            raise ValueError(f"slot outside kvtier's {self._num_slots}")
        local = [p * self.layout.num_blocks + b for p in range(num_parts) for b in block_ids]
        remote = [s * num_parts + p for p in range(num_parts) for s in slots]
        agent = self._nixl.agent
        handle = agent.make_prepped_xfer(  # type: ignore[attr-defined]
            "READ", self._local, local, self._remote, remote, b"")
        run_xfer(agent, handle, self.xfer_timeout_s, f"READ of {len(slots)} tier blocks")

    def checksum(self, block_id: int) -> int:
        """xxh3_64 of block ``block_id`` as packed (its slabs in packing order), read in place."""
        h = xxhash.xxh3_64()
        for rows in self._rows:
            h.update(rows[block_id])
        return h.intdigest()

    def disconnect(self) -> None:
        if self._nixl is None:
            return
        agent = self._nixl.agent
        if self._remote is not None:
            agent.release_dlist_handle(self._remote)  # type: ignore[attr-defined]
            self._remote = None
        if self._peer:
            try:
                agent.remove_remote_agent(self._peer)  # type: ignore[attr-defined]
            except Exception as exc:  # a peer already gone
                log.warning("nixl_remove_remote_failed", error=repr(exc))
            self._peer = ""
        self._pool_key = ("", 0)

    def close(self) -> None:
        if self._nixl is None:
            return
        self.disconnect()
        agent = self._nixl.agent
        if self._local is not None:
            agent.release_dlist_handle(self._local)  # type: ignore[attr-defined]
            self._local = None
        for reg in self._regs:
            agent.deregister_memory(reg)  # type: ignore[attr-defined]
        self._regs = []


def _byte_rows(part: torch.Tensor):
    """``part`` as a uint8 numpy array [num_blocks, slab bytes] sharing its memory (each slab is contiguous,
    ``KvLayout`` checks it; rows are ``part.stride(0)`` elements apart)."""
    whole = torch.as_strided(part, (part.shape[0], part[0].numel()), (part.stride(0), 1))
    return whole.view(torch.uint8).numpy()
