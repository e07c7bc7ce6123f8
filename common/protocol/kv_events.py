"""KV events, source -> router: which blocks a worker (tier "device") or kvtier ("host", "disk") holds."""

from __future__ import annotations

from typing import Union

import msgspec

from common.protocol.base import Msg, Tier

# ------------------------------------------------------------------------------- KV events (source -> router)
# A source is a worker (tier "device") or kvtier ("host", "disk"). Hashes are common.hashing chained block
# hashes (u64), never an engine's own. The three event kinds are tagged so msgspec can decode their union.


class BlockStored(Msg, frozen=True):
    """Blocks now held in ``tier``, in chain order; ``parent_hash`` is the block before the first one
    (None: the first block starts a prompt)."""

    block_hashes: tuple[int, ...]
    parent_hash: int | None
    tier: Tier


class BlockRemoved(Msg, frozen=True):
    block_hashes: tuple[int, ...]
    tier: Tier


class AllCleared(Msg, frozen=True):
    """Every block the source held in ``tier`` is gone (e.g. engine prefix-cache reset)."""

    tier: Tier


KvEvent = Union[BlockStored, BlockRemoved, AllCleared]


class KvEvents(Msg, frozen=True):
    """One batch of a source's events, applied in order. ``event_id`` numbers batches per source from 0,
    +1 per batch; a gap tells the router it lost some and must ask for a ``KvSnapshot``."""

    worker_id: str
    event_id: int
    events: tuple[KvEvent, ...]
    # Random per publisher start (a process start): a new epoch means the source's earlier blocks are gone and
    # numbering began again at 0; the router then needs a snapshot unless this is batch 0.
    epoch: int = 0


class KvSnapshotRequest(Msg, frozen=True):
    request_id: str
    worker_id: str


class StoredBlock(msgspec.Struct, frozen=True, array_like=True):
    """One held block in a snapshot; array_like because snapshots can carry millions of them."""

    block_hash: int
    parent_hash: int | None
    tier: Tier


class KvSnapshot(Msg, frozen=True):
    """Everything a source holds, in every tier: enough for the router to rebuild that source's entries."""

    request_id: str
    worker_id: str
    # The last batch reflected here (-1: none published yet); batches after it apply on top.
    event_id: int
    tier_blocks: tuple[StoredBlock, ...]
    # The publisher's epoch (KvEvents.epoch) that event_id counts in.
    epoch: int = 0
