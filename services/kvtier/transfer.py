"""The seam where block bytes cross between a worker and kvtier's pool.

Today: ``InlineTransfer``. A ``TierStore`` carries each block's bytes in ``TierBlock.data`` (msgpack bin);
kvtier checks size and xxh3_64 checksum and copies them into a host-pool slot. A ``TierBlocks`` reply
carries the bytes read from host slots (or the disk tier) inline.

Later (the vLLM KV connector): a NIXL transfer of the same layout. The pool is one registered buffer of
fixed ``block_bytes`` slots (``HostPool.addr(slot)``), and a block is addressed by its chained hash, so:

* store: the worker sends ``TierStore`` with ``data`` empty plus its NIXL agent metadata and the address of
  each block in its registered KV memory; kvtier allocates slots (``TierIndex.store``) and READs into them
  with one prepared descriptor list (coalescing adjacent slots), then verifies checksums and acks.
* load: kvtier answers ``TierLookup`` with slot addresses of its pool (and pins those slots until a
  ``release`` or a timeout: eviction must not reuse a slot being read); the worker READs them with NIXL
  into its own KV blocks and verifies checksums before the engine uses them.

Everything above this module (index, eviction, events, checksums, router credit) stays as it is.
"""

from __future__ import annotations

from collections.abc import Sequence

import xxhash

from common.protocol import TierBlock


def checksum(data: bytes | memoryview) -> int:
    return xxhash.xxh3_64_intdigest(data)


class InlineTransfer:
    """Bytes in the message; the only data path kvtier has today."""

    name = "inline"

    @staticmethod
    def incoming(block: TierBlock) -> bytes | None:
        """The block's bytes if they match its declared size and checksum, else None (refuse it)."""
        data = block.data
        if len(data) != block.size or checksum(data) != block.checksum:
            return None
        return data

    @staticmethod
    def outgoing(block_hash: int, checksum_: int, tier: str, data: bytes) -> TierBlock:
        return TierBlock(block_hash=block_hash, checksum=checksum_, size=len(data), tier=tier,  # type: ignore[arg-type]
                         data=data)

    @staticmethod
    def pack(blocks: Sequence[tuple[int, bytes]]) -> tuple[TierBlock, ...]:
        """Worker side: (hash, bytes) -> TierBlocks with checksums, ready for a TierStore."""
        return tuple(TierBlock(block_hash=h, checksum=checksum(d), size=len(d), data=d) for h, d in blocks)
