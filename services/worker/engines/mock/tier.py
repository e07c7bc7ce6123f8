"""The mock engine's side of a shared KV tier (kvtier): blocks that leave the prefix cache (or, write-through,
every block it caches) go to the tier with a deterministic stand-in payload; a new prompt's continuation of
the local prefix comes back from it (the engine then simulates the transfer time) instead of recomputed."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog
import xxhash

from common.hashing import block_hashes
from services.worker.engine import BlocksRemoved, BlocksStored, KvEvent
from services.worker.engines.mock.block_manager import BlockManager
from services.worker.engines.mock.payload import fake_kv_checksum, fake_kv_payload
from services.worker.tier_load_log import slowest_tier

if TYPE_CHECKING:
    from common.kvtier.client import TierBackend

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Onboard:
    """What the tier holds of a prompt: its prefix of ``num_tokens`` tokens (local or tier; 0: the tier adds
    nothing), the slowest tier the fetched blocks came from, and the lookup's wall seconds."""

    num_tokens: int = 0
    tier: str = "host"
    lookup_s: float = 0.0


class TierLink:
    def __init__(self, tier: TierBackend, blocks: BlockManager, block_bytes: int, write_through: bool) -> None:
        self.tier = tier
        self._blocks = blocks
        self._block_bytes = block_bytes
        self._write_through = write_through
        self.num_onboard_rejected = 0

    def offload(self, events: Sequence[KvEvent]) -> None:
        """Offload the blocks these block-manager events took out of the cache (and stored, write-through)."""
        hashes: list[int] = []
        for event in events:
            if isinstance(event, BlocksRemoved) or (self._write_through and isinstance(event, BlocksStored)):
                hashes += event.block_hashes
        if hashes:
            self.tier.offload(hashes, self._payload)

    def _payload(self, block_hash: int) -> bytes:
        return fake_kv_payload(block_hash, self._block_bytes)

    async def onboard_tokens(self, token_ids: Sequence[int]) -> Onboard:
        """The prompt's prefix whose KV is local or in the tier.

        Only blocks before the last token count (that one is always computed). Each fetched block must be
        exactly the KV of its prefix (here: the stand-in payload of its hash); the first one that is not
        ends the run, and the rest is recomputed.
        """
        block_size = self._blocks.block_size
        hashes = block_hashes(token_ids[:-1], block_size, self._blocks.hash_seed)
        num_local = self._blocks.match_prefix(token_ids[:-1]).num_cached_tokens // block_size
        if num_local >= len(hashes):
            return Onboard()
        began = time.perf_counter()
        fetched = await self.tier.lookup(hashes[num_local:])
        lookup_s = time.perf_counter() - began
        num_good = 0
        for block in fetched:
            if (len(block.data) != self._block_bytes
                    or xxhash.xxh3_64_intdigest(block.data) != fake_kv_checksum(block.block_hash, self._block_bytes)):
                self.num_onboard_rejected += 1
                log.warning("tier_block_mismatch", block_hash=block.block_hash)
                break
            num_good += 1
        if not num_good:
            return Onboard()
        return Onboard((num_local + num_good) * block_size, slowest_tier([b.tier for b in fetched[:num_good]]),
                       lookup_s)

    async def close(self) -> None:
        await self.tier.close()
