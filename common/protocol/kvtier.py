"""kvtier <-> router and workers: registration, storing and looking up blocks, stats."""

from __future__ import annotations

import msgspec

from common.protocol.base import Msg, Tier

# ------------------------------------------------------------------------------ kvtier <-> router, workers
# kvtier is a shared KV store: a NIXL-registered host pool of fixed-size slots and NVMe files, blocks named
# by the chained hashes of common.hashing. It registers with the router like a worker (``RegisterTier`` ->
# ``RegisterAck`` with the events endpoint), heartbeats with ``Heartbeat(worker_id=tier_id)``, publishes
# ``KvEvents`` with tier "host"/"disk" under its tier id, and answers ``KvSnapshotRequest``. Workers store
# blocks (``TierStore`` -> ``TierStored``) and load the leading run of a prompt's blocks (``TierLookup`` ->
# ``TierBlocks``). Stores carry bytes inline (msgpack bin); lookups carry them inline too, or, with
# ``host_slots``, name slots of kvtier's registered pool for the worker to READ with NIXL (common/kvtier/transfer.py).


class RegisterTier(Msg, frozen=True):
    request_id: str
    tier_id: str
    # kvtier's ROUTER socket, where workers send TierStore / TierLookup.
    endpoint: str
    # PROTOCOL_VERSION of the sender (see RegisterWorker).
    protocol_version: int = 0
    # Fixed slot size of the pool: the largest block kvtier holds.
    block_bytes: int = 0
    # NIXL agent name of the pool ("" = no NIXL registration).
    nixl_agent: str = ""
    # The machine kvtier serves (one kvtier per node: its DRAM and NVMe) and its zone; see WorkerInfo.node.
    node: str = ""
    zone: str = ""


class TierBlock(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """One block's bytes (inline) with their xxh3_64 checksum; ``size`` = len(data). In a probe reply, or a NIXL
    lookup's host blocks, ``data`` is empty: ``slot`` (>= 0) says which host-pool slot to READ."""

    block_hash: int
    checksum: int
    size: int
    tier: Tier = "host"
    data: bytes = b""
    slot: int = -1


class TierStore(Msg, frozen=True):
    """Keep these blocks (chain order; ``parent_hash`` is the block before the first)."""

    request_id: str
    worker_id: str
    blocks: tuple[TierBlock, ...]
    parent_hash: int | None = None
    # The model these blocks are KV of (the worker's hash seed, a digest of the model's identity: common/
    # model_identity.py). kvtier keeps blocks per model: a lookup of another model never gets them.
    model_id: int = 0


class TierStored(Msg, frozen=True):
    request_id: str
    num_stored: int = 0
    # Already held (refreshed in the LRU, bytes ignored).
    num_present: int = 0
    # Refused: checksum or size wrong, larger than a slot, or no room.
    num_rejected: int = 0


class TierLookup(Msg, frozen=True):
    """The longest LEADING run of ``block_hashes`` kvtier holds, with the data; ``max_blocks`` caps one reply
    (0: as many as fit in a message). Ask again from where a full reply stopped."""

    request_id: str
    block_hashes: tuple[int, ...]
    max_blocks: int = 0
    # False: a probe. The reply lists the held leading run (hash, checksum, size, tier) without bytes, counts
    # no hits and refreshes no LRU entry (vLLM's scheduler asks this before it decides to load).
    with_data: bool = True
    # True: host-tier blocks come back as pool slots (``TierBlock.slot``) for the worker to READ with NIXL, not
    # as bytes; disk-tier blocks still come inline. Checksums come either way: the worker verifies after READ.
    host_slots: bool = False
    # The asker's model (TierStore.model_id): blocks stored for another model are a miss.
    model_id: int = 0


class TierBlocks(Msg, frozen=True):
    request_id: str
    # The first len(blocks) of the asked hashes, in order; every block verified against its checksum by
    # kvtier before sending (a corrupt one ends the run and is dropped).
    blocks: tuple[TierBlock, ...] = ()
    # The reply stopped at its size cap, not at the end of the run: ask again for the rest.
    truncated: bool = False
    # ``host_slots`` replies: the NIXL agent whose pool the slots belong to (a restarted kvtier has another).
    nixl_agent: str = ""


class TierStats(Msg, frozen=True):
    request_id: str
    tier_id: str
    block_bytes: int
    host_slots: int
    host_used: int
    disk_slots: int = 0
    disk_used: int = 0
    hits_host: int = 0
    hits_disk: int = 0
    # Lookups whose first asked block was held nowhere.
    misses: int = 0
    blocks_stored: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    evictions_host: int = 0
    evictions_disk: int = 0
    demotions: int = 0
    checksum_failures: int = 0
    # "nixl" or "os" (plain pread/pwrite) for the disk tier; "" when there is no disk tier.
    disk_io: str = ""
    nixl: bool = False
    # For NIXL READs of the host pool (when ``nixl``): the agent's name and metadata (for add_remote_agent), and
    # the pool's base address; slot i is [pool_addr + i * block_bytes, + block_bytes).
    nixl_agent: str = ""
    nixl_metadata: bytes = b""
    pool_addr: int = 0
    # Slots in the registered pool: the host tier's, then bounce slots that disk blocks are read into.
    pool_slots: int = 0
