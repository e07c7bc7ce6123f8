"""Approximate prefix index for engines that publish no KV events.

The router remembers where it sent each prompt's blocks and assumes the worker keeps them on device for
``ttl_s`` seconds (refreshed by every new route there). It is a guess: engines evict under pressure and
never tell us, so the TTL should be about how long a prefix survives at the expected load.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from services.router.index import TierOverlap


class ApproxIndex:
    def __init__(self, ttl_s: float = 120.0, clock: Callable[[], float] = time.monotonic) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        self.ttl_s = ttl_s
        self._clock = clock  # seconds; injectable so tests control time
        # hash -> worker -> expiry time (clock seconds).
        self._expiry: dict[int, dict[str, float]] = {}
        # (expiry, worker, hashes) in record order; the TTL is constant, so expiries are non-decreasing.
        self._records: deque[tuple[float, str, tuple[int, ...]]] = deque()
        self._num_blocks = 0

    @property
    def num_blocks(self) -> int:
        """(worker, hash) entries held, expired ones included until ``expire`` runs."""
        return self._num_blocks

    def record(self, worker_id: str, hashes: Sequence[int]) -> None:
        """The router sent a request with these chained hashes to ``worker_id``."""
        now = self._clock()
        self.expire(now)
        until = now + self.ttl_s
        expiry = self._expiry
        for block_hash in hashes:
            holders = expiry.get(block_hash)
            if holders is None:
                expiry[block_hash] = {worker_id: until}
                self._num_blocks += 1
            else:
                self._num_blocks += worker_id not in holders
                holders[worker_id] = until
        self._records.append((until, worker_id, tuple(hashes)))

    def expire(self, now: float | None = None) -> int:
        """Drop entries whose TTL ran out; returns how many. Lookups ignore them anyway."""
        now = self._clock() if now is None else now
        dropped = 0
        while self._records and self._records[0][0] <= now:
            _, worker_id, hashes = self._records.popleft()
            for block_hash in hashes:
                holders = self._expiry.get(block_hash)
                # A later record refreshed the entry when its expiry is still ahead.
                if holders is not None and holders.get(worker_id, now + 1) <= now:
                    del holders[worker_id]
                    dropped += 1
                    if not holders:
                        del self._expiry[block_hash]
        self._num_blocks -= dropped
        return dropped

    def overlaps(self, hashes: Sequence[int], worker_ids: Iterable[str] | None = None) -> dict[str, TierOverlap]:
        """Same contract as ``PrefixIndex.overlaps``; every guessed block is on device."""
        now = self._clock()
        wanted = None if worker_ids is None else set(worker_ids)
        runs: dict[str, int] = {}
        alive: set[str] | None = None
        for n, block_hash in enumerate(hashes):
            holders = self._expiry.get(block_hash, {})
            live = {w for w, until in holders.items() if until > now}
            if alive is None:
                alive = live if wanted is None else live & wanted
            for worker_id in alive - live:
                runs[worker_id] = n
            alive &= live
            if not alive:
                break
        else:
            for worker_id in alive or ():
                runs[worker_id] = len(hashes)
        return {w: TierOverlap(device=n, host=n, disk=n) for w, n in runs.items() if n}

    def remove_worker(self, worker_id: str) -> None:
        for block_hash in [h for h, holders in self._expiry.items() if worker_id in holders]:
            holders = self._expiry[block_hash]
            del holders[worker_id]
            self._num_blocks -= 1
            if not holders:
                del self._expiry[block_hash]
