"""Paged KV block manager of the mock engine: a fixed pool, a prefix cache by chained block hashes, LRU eviction.

A sequence holds an ordered table of block ids. Blocks whose tokens are all computed get their chained hash
(docs/architecture.md#contracts) and enter the prefix cache; other sequences with the same prefix share them by refcount. A block
nobody references keeps its hash and sits in an LRU list (still reusable) until a fresh block is needed and
the free list is empty; then the least recently freed one is evicted. Every store and eviction is recorded
as a KV event for the worker to publish.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from common.hashing import block_hashes, extend_block_hashes
from services.worker.engine import BlocksRemoved, BlocksStored, KvEvent

# --------------------------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class Match:
    """Cached prefix of a token sequence: whole blocks only."""

    num_cached_tokens: int
    block_ids: tuple[int, ...]


@dataclass(slots=True)
class _Table:
    block_ids: list[int]
    # Chained hashes of the sequence's leading full, computed blocks (len <= len(block_ids)).
    hashes: list[int]
    seed: int = 0  # what they hash under


# ------------------------------------------------------------------------------------------------- manager


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, hash_seed: int = 0) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks ({num_blocks}) and block_size ({block_size}) must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.hash_seed = hash_seed
        self._ref_counts = [0] * num_blocks
        self._block_hash: list[int | None] = [None] * num_blocks
        self._cached: dict[int, int] = {}  # block hash -> block id
        self._free: deque[int] = deque(range(num_blocks))  # unreferenced, unhashed
        self._evictable: OrderedDict[int, None] = OrderedDict()  # unreferenced, hashed; oldest first
        self._tables: dict[str, _Table] = {}
        self._events: list[KvEvent] = []

    # ------------------------------------------------------------------------------------------ figures

    @property
    def num_free_blocks(self) -> int:
        """Blocks a new allocation can get: free plus evictable cached ones."""
        return len(self._free) + len(self._evictable)

    def cached_hashes(self) -> tuple[int, ...]:
        """Every block hash in the prefix cache (for a KV snapshot)."""
        return tuple(self._cached)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def has_seq(self, seq_id: str) -> bool:
        return seq_id in self._tables

    def block_ids(self, seq_id: str) -> tuple[int, ...]:
        return tuple(self._tables[seq_id].block_ids)

    def num_seq_blocks(self, seq_id: str) -> int:
        return len(self._tables[seq_id].block_ids)

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    # ------------------------------------------------------------------------------------------- lookup

    def match_prefix(self, token_ids: Sequence[int], seed: int | None = None) -> Match:
        """Longest run of leading full blocks of ``token_ids`` (hashed under ``seed``, None: the manager's) in the
        cache. Changes nothing."""
        block_ids: list[int] = []
        for block_hash in block_hashes(token_ids, self.block_size, self.hash_seed if seed is None else seed):
            block_id = self._cached.get(block_hash)
            if block_id is None:
                break
            block_ids.append(block_id)
        return Match(num_cached_tokens=len(block_ids) * self.block_size, block_ids=tuple(block_ids))

    # -------------------------------------------------------------------------------------- allocation

    def allocate(self, seq_id: str, match: Match, num_tokens: int, seed: int | None = None) -> bool:
        """Start ``seq_id``'s table: share ``match``'s blocks, add fresh ones up to ``num_tokens`` tokens.

        ``match`` must come from ``match_prefix`` with no allocation in between. Returns False, changing
        nothing, when the pool cannot supply the fresh blocks.
        """
        if seq_id in self._tables:
            raise ValueError(f"sequence {seq_id!r} already holds blocks")
        if num_tokens < match.num_cached_tokens:
            raise ValueError(f"num_tokens {num_tokens} < cached tokens {match.num_cached_tokens}")
        for block_id in match.block_ids:
            if self._block_hash[block_id] is None:
                raise ValueError(f"stale match: block {block_id} is no longer cached")
        num_fresh = self.blocks_for(num_tokens) - len(match.block_ids)
        # Matched blocks nobody holds leave the evictable list when shared, so they are not free for us.
        num_reclaimed = sum(1 for block_id in match.block_ids if self._ref_counts[block_id] == 0)
        if num_fresh > self.num_free_blocks - num_reclaimed:
            return False
        for block_id in match.block_ids:
            self._share(block_id)
        hashes = [self._cached_hash(block_id) for block_id in match.block_ids]
        self._tables[seq_id] = _Table(list(match.block_ids) + self._take_fresh(num_fresh), hashes,
                                      self.hash_seed if seed is None else seed)
        return True

    def append(self, seq_id: str, num_tokens: int) -> bool:
        """Grow ``seq_id``'s table to hold ``num_tokens`` tokens. False, changing nothing, if the pool can't."""
        table = self._tables[seq_id]
        num_fresh = self.blocks_for(num_tokens) - len(table.block_ids)
        if num_fresh <= 0:
            return True
        if num_fresh > self.num_free_blocks:
            return False
        table.block_ids.extend(self._take_fresh(num_fresh))
        return True

    def commit(self, seq_id: str, token_ids: Sequence[int], num_computed_tokens: int) -> None:
        """The first ``num_computed_tokens`` of ``token_ids`` have KV now: hash and cache blocks that are full.

        A block whose hash another block already holds (two sequences computed the same prefix at once)
        stays uncached; the sequence's hash chain continues regardless.
        """
        table = self._tables[seq_id]
        num_full = min(num_computed_tokens // self.block_size, len(table.block_ids))
        num_hashed = len(table.hashes)
        if num_full <= num_hashed:
            return
        full_tokens = token_ids[: num_full * self.block_size]
        new_hashes = extend_block_hashes(table.hashes, full_tokens, self.block_size, table.seed)[num_hashed:]
        run: list[int] = []
        run_parent: int | None = None
        prev = table.hashes[-1] if table.hashes else None
        for offset, block_hash in enumerate(new_hashes):
            block_id = table.block_ids[num_hashed + offset]
            table.hashes.append(block_hash)
            if self._block_hash[block_id] is None and block_hash not in self._cached:
                self._block_hash[block_id] = block_hash
                self._cached[block_hash] = block_id
                if not run:
                    run_parent = prev
                run.append(block_hash)
            elif run:
                self._events.append(BlocksStored(tuple(run), run_parent))
                run = []
            prev = block_hash
        if run:
            self._events.append(BlocksStored(tuple(run), run_parent))

    def free(self, seq_id: str) -> bool:
        """Release ``seq_id``'s blocks; cached ones stay reusable. False if it held none."""
        table = self._tables.pop(seq_id, None)
        if table is None:
            return False
        # Tail first, so the LRU evicts a sequence's last blocks (the least shared) before its first ones.
        self.unpin(reversed(table.block_ids))
        return True

    def pin(self, block_ids: Sequence[int]) -> None:
        """One more reference to each block, whoever holds it (none: it leaves the free or evictable list): KV
        that must outlive its sequence (a prefill's blocks until a decode engine has READ them, a decode's under a
        READ still landing). ``unpin`` drops it."""
        for block_id in block_ids:
            if self._ref_counts[block_id] == 0 and self._block_hash[block_id] is None:
                self._free.remove(block_id)
                self._ref_counts[block_id] = 1
            else:
                self._share(block_id)

    def unpin(self, block_ids: Iterable[int]) -> None:
        for block_id in block_ids:
            self._ref_counts[block_id] -= 1
            if self._ref_counts[block_id] > 0:
                continue
            if self._block_hash[block_id] is None:
                self._free.append(block_id)
            else:
                self._evictable[block_id] = None

    def drain_events(self) -> list[KvEvent]:
        """KV events since the previous call, oldest first."""
        events, self._events = self._events, []
        return events

    # ---------------------------------------------------------------------------------------- internals

    def _cached_hash(self, block_id: int) -> int:
        block_hash = self._block_hash[block_id]
        assert block_hash is not None
        return block_hash

    def _share(self, block_id: int) -> None:
        if self._ref_counts[block_id] == 0:
            del self._evictable[block_id]
        self._ref_counts[block_id] += 1

    def _take_fresh(self, num_blocks: int) -> list[int]:
        """Unhashed blocks with refcount 1: the free list first, then LRU eviction of cached ones."""
        taken: list[int] = []
        removed: list[int] = []
        for _ in range(num_blocks):
            if self._free:
                block_id = self._free.popleft()
            else:
                block_id, _ = self._evictable.popitem(last=False)
                block_hash = self._cached_hash(block_id)
                del self._cached[block_hash]
                self._block_hash[block_id] = None
                removed.append(block_hash)
            self._ref_counts[block_id] = 1
            taken.append(block_id)
        if removed:
            self._events.append(BlocksRemoved(tuple(removed)))
        return taken
