"""The seam where block bytes cross between a worker and kvtier's pool.

``InlineTransfer``: a ``TierStore`` carries each block's bytes in ``TierBlock.data`` (msgpack bin); kvtier checks
size and xxh3_64 checksum and copies them into a host-pool slot. A ``TierBlocks`` reply to a plain
``TierLookup`` carries the bytes read from host slots (or the disk tier) inline. The mock engine uses only this;
vLLM workers use it for stores (write-through) and when NIXL is unavailable.

NIXL (vLLM workers, ``services/worker/engines/vllm/tier/loader.py``): the pool is one registered buffer of fixed
``block_bytes`` slots (``HostPool.addr(slot)``), so a ``TierLookup(host_slots=True)`` reply names slots instead of
carrying bytes: host blocks' own slots, and bounce slots (past the host tier's) that kvtier has just read disk
blocks into. The worker READs them with NIXL straight into its KV cache (its agent learns the pool from
``TierStats``) and verifies each block's checksum there. Slots are not pinned: a slot reused under a READ fails its
checksum and costs a recompute. Stores by NIXL (kvtier READing from workers) are not built.
"""

from __future__ import annotations

from collections.abc import Sequence

import xxhash

from common.protocol import TierBlock


def checksum(data: bytes | memoryview) -> int:
    return xxhash.xxh3_64_intdigest(data)


def intact(block: TierBlock) -> bool:
    """Its inline bytes are its declared size and checksum."""
    return len(block.data) == block.size and checksum(block.data) == block.checksum


def block_ok(block: TierBlock, expected_hash: int, block_bytes: int | None = None, slot_ok: bool = False) -> bool:
    """A block kvtier sent back is the one asked for: its hash, its size (``block_bytes``, when given) and its
    inline bytes intact; with ``slot_ok`` a block that names a pool slot instead of carrying bytes passes (its
    checksum is verified after the NIXL READ)."""
    if block.block_hash != expected_hash or (block_bytes is not None and block.size != block_bytes):
        return False
    return (slot_ok and block.slot >= 0 and not block.data) or intact(block)


class InlineTransfer:
    """Bytes in the message; the only data path kvtier has today."""

    name = "inline"

    @staticmethod
    def incoming(block: TierBlock) -> bytes | None:
        """The block's bytes if they match its declared size and checksum, else None (refuse it)."""
        return block.data if intact(block) else None

    @staticmethod
    def outgoing(block_hash: int, checksum_: int, tier: str, data: bytes) -> TierBlock:
        return TierBlock(block_hash=block_hash, checksum=checksum_, size=len(data), tier=tier,  # type: ignore[arg-type]
                         data=data)

    @staticmethod
    def pack(blocks: Sequence[tuple[int, bytes]]) -> tuple[TierBlock, ...]:
        """Worker side: (hash, bytes) -> TierBlocks with checksums, ready for a TierStore."""
        return tuple(TierBlock(block_hash=h, checksum=checksum(d), size=len(d), data=d) for h, d in blocks)
