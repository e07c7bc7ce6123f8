"""Every message that crosses a process boundary.

Each message is a frozen, tagged ``msgspec.Struct`` encoded as msgpack. The tag is the class name, so a
decoder built over the ``Message`` union decodes any of them and ``match`` dispatches on the type.
Messages that expect a reply carry ``request_id``; replies echo it.
"""

from __future__ import annotations

from typing import Literal, Union

import msgspec

# The wire contract's release: bumped whenever a message changes incompatibly. Registrations carry it and the router
# refuses a peer of another version loudly (a field it does not know would otherwise be silently misread).
PROTOCOL_VERSION = 3

Role = Literal["prefill", "decode", "both"]
Tier = Literal["device", "host", "disk"]
FinishReason = Literal["stop", "length", "abort", "error"]


class _Msg(msgspec.Struct, frozen=True, tag=True, array_like=False, omit_defaults=True):
    pass


# --------------------------------------------------------------------------------------------- shared parts


class SamplingParams(msgspec.Struct, frozen=True, omit_defaults=True):
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    # Token ids that end generation (the model's EOS ids and any the user asked for).
    stop_token_ids: tuple[int, ...] = ()


class KvTransferParams(msgspec.Struct, frozen=True, omit_defaults=True):
    """Where a prefilled request's KV lives and how to pull it (vLLM NixlConnector's fields, typed).

    A prefill worker returns these with its first token; the decode worker's engine pulls the blocks.
    """

    remote_engine_id: str
    remote_block_ids: tuple[int, ...]
    # The prefill engine's NIXL side channel as decode engines dial it (its advertised host, never a wildcard);
    # "" from engines that move no bytes (mock).
    remote_host: str = ""
    remote_port: int = 0
    tp_size: int = 1
    # The prefill worker's id for the request, when the engine names it differently from ours.
    remote_request_id: str = ""
    # Bytes of KV behind remote_block_ids (for metrics and the mock engine's transfer time).
    num_bytes: int = 0


class WorkerLoad(msgspec.Struct, frozen=True, omit_defaults=True):
    num_running: int = 0
    num_waiting: int = 0
    num_free_blocks: int = 0
    num_total_blocks: int = 0
    # Blocks held by sequences that are decoding (the router's load term).
    num_active_blocks: int = 0
    # Prompt tokens queued for prefill (waiting requests, and the rest of chunked prefills); -1: the engine
    # does not count them (the router then estimates from num_waiting).
    num_waiting_tokens: int = -1
    # Prefill throughput the engine measured lately, tokens/s; 0: not measured (the router uses its default).
    prefill_tokens_per_s: float = 0.0


class WorkerInfo(msgspec.Struct, frozen=True, omit_defaults=True):
    worker_id: str
    role: Role
    model: str
    block_size: int
    num_blocks: int
    # ZeroMQ endpoint of the worker's ROUTER socket for generate requests.
    endpoint: str
    engine: str = "mock"
    # Seed mixed into block hashes (docs/architecture.md#contracts); workers of one model must agree.
    hash_seed: int = 0
    max_model_len: int = 0
    # The engine publishes KV events; without them the router indexes its own decisions (approximate mode).
    kv_events: bool = False
    # Where the worker runs: a machine name (default its hostname) and an optional failure/network zone. The
    # router prices KV moves between nodes by the link between them (same node: shared memory, no wire).
    node: str = ""
    zone: str = ""
    # Bytes of KV one token occupies on this engine (all layers, K and V); 0: unknown. The router prices a
    # prefilled prompt's move at num_tokens * this over the link.
    kv_bytes_per_token: int = 0
    # Random per process start: a restarted worker keeps its worker_id but not this, so a frontend migrating
    # away from a dead worker excludes that process, never its successor.
    instance_id: str = ""


# ------------------------------------------------------------------------------------------ worker <-> router


class RegisterWorker(_Msg, frozen=True):
    request_id: str
    info: WorkerInfo
    # PROTOCOL_VERSION of the sender; 0 = a release from before versions were sent.
    protocol_version: int = 0


class RegisterAck(_Msg, frozen=True):
    request_id: str
    worker_id: str
    # Where the worker's PUB socket connects to publish KvEvents ("" = the router takes no events).
    events_endpoint: str = ""


class Heartbeat(_Msg, frozen=True):
    worker_id: str
    load: WorkerLoad
    # Heartbeats are numbered so the router can tell a restarted worker from a late packet.
    seq: int = 0
    # The worker is draining (SIGTERM or a scale-down): route nothing new to it; it exits once idle.
    draining: bool = False
    # KV pulls finished since the previous heartbeat, oldest first (the router learns link bandwidths from them).
    transfers: tuple[TransferSample, ...] = ()


class Unregister(_Msg, frozen=True):
    worker_id: str


# ---------------------------------------------------------------------------------------- frontend <-> router


class RouteRequest(_Msg, frozen=True):
    request_id: str
    model: str
    token_ids: tuple[int, ...]
    # Workers the frontend wants avoided (e.g. one that just failed this request).
    exclude_worker_ids: tuple[str, ...] = ()
    # Worker processes (WorkerInfo.instance_id) to avoid: the one a migrating request lost, not its restart.
    exclude_instance_ids: tuple[str, ...] = ()


class WorkerRef(msgspec.Struct, frozen=True, omit_defaults=True):
    worker_id: str
    endpoint: str
    instance_id: str = ""


class Route(_Msg, frozen=True):
    request_id: str
    decode: WorkerRef
    # None: the decode worker prefills locally.
    prefill: WorkerRef | None = None
    num_cached_tokens_predicted: int = 0


class ListWorkers(_Msg, frozen=True):
    request_id: str


class WorkerList(_Msg, frozen=True):
    request_id: str
    workers: tuple[WorkerInfo, ...]
    loads: tuple[WorkerLoad, ...]
    # Ids of listed workers that are draining: they finish what they hold and take nothing new.
    draining: tuple[str, ...] = ()


# --------------------------------------------------------------------------------------- frontend <-> worker


class Generate(_Msg, frozen=True):
    request_id: str
    token_ids: tuple[int, ...]
    sampling: SamplingParams
    # Prefill worker: compute the prompt, return the first token and where its KV lives.
    prefill_only: bool = False
    # Decode worker: pull the prompt's KV from here instead of computing it. token_ids then holds the
    # prompt followed by the first token the prefill worker produced.
    kv_transfer: KvTransferParams | None = None


class Tokens(_Msg, frozen=True):
    """A streamed slice of output; the last one has finish_reason set."""

    request_id: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    # Set on a prefill-only request's final message.
    kv_transfer: KvTransferParams | None = None
    # Set when the request pulled KV remotely and the pull failed so the worker recomputed.
    transfer_failed: bool = False


class Abort(_Msg, frozen=True):
    request_id: str


class GetStats(_Msg, frozen=True):
    request_id: str


class TransferSample(msgspec.Struct, frozen=True, omit_defaults=True):
    """One finished KV pull, as the decode engine timed it (vLLM: the NIXL telemetry of one READ)."""

    seq: int  # 1-based: this was the worker's seq-th pull (compare with WorkerStats.num_transfers)
    seconds: float  # post to completion
    num_bytes: int
    num_descriptors: int = 0  # after NIXL merged adjacent blocks; 0 where unknown (mock)
    post_seconds: float = 0.0  # inside the post call (NIXL on CPU copies there); 0 where unknown
    # Worker the KV was pulled from (KvTransferParams.remote_engine_id = the prefill worker's id); "" unknown.
    src_worker_id: str = ""


class WorkerStats(_Msg, frozen=True):
    request_id: str
    worker_id: str
    load: WorkerLoad
    num_prefix_hits: int = 0
    num_transfers: int = 0
    num_transfer_failures: int = 0
    num_transfer_bytes: int = 0
    # Seconds spent in those pulls, summed (decode side; vLLM: NIXL telemetry xferDuration). GB/s = bytes / this.
    transfer_seconds_total: float = 0.0
    # NIXL descriptors those pulls posted, summed, after NIXL merged adjacent blocks (vLLM: telemetry descCount);
    # 0 where unknown (mock). Says which raw READ a transfer compares with: one per block, or one per region.
    num_transfer_descriptors: int = 0
    # The last pulls one by one, oldest first (at most services.worker.transfer_log.RECENT_TRANSFERS): sums hide
    # whether a slow run was a few outliers or every pull.
    recent_transfers: tuple[TransferSample, ...] = ()
    # Prompt tokens by where their KV came from, cumulative (vLLM's scheduler accounting; 0 where unknown: mock):
    # computed here, hit in this engine's prefix cache, pulled from elsewhere (NIXL from a prefill worker, kvtier).
    # A decode worker that recomputes a prompt it should have pulled shows up here, not in the output.
    num_prompt_tokens_computed: int = 0
    num_prompt_tokens_cached: int = 0
    num_prompt_tokens_pulled: int = 0


# ------------------------------------------------------------------------------- KV events (source -> router)
# A source is a worker (tier "device") or kvtier ("host", "disk"). Hashes are common.hashing chained block
# hashes (u64), never an engine's own. The three event kinds are tagged so msgspec can decode their union.


class BlockStored(_Msg, frozen=True):
    """Blocks now held in ``tier``, in chain order; ``parent_hash`` is the block before the first one
    (None: the first block starts a prompt)."""

    block_hashes: tuple[int, ...]
    parent_hash: int | None
    tier: Tier


class BlockRemoved(_Msg, frozen=True):
    block_hashes: tuple[int, ...]
    tier: Tier


class AllCleared(_Msg, frozen=True):
    """Every block the source held in ``tier`` is gone (e.g. engine prefix-cache reset)."""

    tier: Tier


KvEvent = Union[BlockStored, BlockRemoved, AllCleared]


class KvEvents(_Msg, frozen=True):
    """One batch of a source's events, applied in order. ``event_id`` numbers batches per source from 0,
    +1 per batch; a gap tells the router it lost some and must ask for a ``KvSnapshot``."""

    worker_id: str
    event_id: int
    events: tuple[KvEvent, ...]
    # Random per publisher start (a process start): a new epoch means the source's earlier blocks are gone and
    # numbering began again at 0; the router then needs a snapshot unless this is batch 0.
    epoch: int = 0


class KvSnapshotRequest(_Msg, frozen=True):
    request_id: str
    worker_id: str


class StoredBlock(msgspec.Struct, frozen=True, array_like=True):
    """One held block in a snapshot; array_like because snapshots can carry millions of them."""

    block_hash: int
    parent_hash: int | None
    tier: Tier


class KvSnapshot(_Msg, frozen=True):
    """Everything a source holds, in every tier: enough for the router to rebuild that source's entries."""

    request_id: str
    worker_id: str
    # The last batch reflected here (-1: none published yet); batches after it apply on top.
    event_id: int
    tier_blocks: tuple[StoredBlock, ...]
    # The publisher's epoch (KvEvents.epoch) that event_id counts in.
    epoch: int = 0


# ------------------------------------------------------------------------------ kvtier <-> router, workers
# kvtier is a shared KV store: a NIXL-registered host pool of fixed-size slots and NVMe files, blocks named
# by the chained hashes of common.hashing. It registers with the router like a worker (``RegisterTier`` ->
# ``RegisterAck`` with the events endpoint), heartbeats with ``Heartbeat(worker_id=tier_id)``, publishes
# ``KvEvents`` with tier "host"/"disk" under its tier id, and answers ``KvSnapshotRequest``. Workers store
# blocks (``TierStore`` -> ``TierStored``) and load the leading run of a prompt's blocks (``TierLookup`` ->
# ``TierBlocks``). Stores carry bytes inline (msgpack bin); lookups carry them inline too, or, with
# ``host_slots``, name slots of kvtier's registered pool for the worker to READ with NIXL (common/kvtier/transfer.py).


class RegisterTier(_Msg, frozen=True):
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


class TierStore(_Msg, frozen=True):
    """Keep these blocks (chain order; ``parent_hash`` is the block before the first)."""

    request_id: str
    worker_id: str
    blocks: tuple[TierBlock, ...]
    parent_hash: int | None = None


class TierStored(_Msg, frozen=True):
    request_id: str
    num_stored: int = 0
    # Already held (refreshed in the LRU, bytes ignored).
    num_present: int = 0
    # Refused: checksum or size wrong, larger than a slot, or no room.
    num_rejected: int = 0


class TierLookup(_Msg, frozen=True):
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


class TierBlocks(_Msg, frozen=True):
    request_id: str
    # The first len(blocks) of the asked hashes, in order; every block verified against its checksum by
    # kvtier before sending (a corrupt one ends the run and is dropped).
    blocks: tuple[TierBlock, ...] = ()
    # The reply stopped at its size cap, not at the end of the run: ask again for the rest.
    truncated: bool = False
    # ``host_slots`` replies: the NIXL agent whose pool the slots belong to (a restarted kvtier has another).
    nixl_agent: str = ""


class TierStats(_Msg, frozen=True):
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


# ------------------------------------------------------------------------------ planner -> orchestrators (PUB)


class ScaleRequest(_Msg, frozen=True):
    """The planner wants ``pool`` to have ``target`` workers (published; any orchestrator may act on it).

    Idempotent: the latest request per pool wins, so an orchestrator that missed some only acts on the last.
    Scale-down means drain: SIGTERM a worker of that pool (it finishes its requests, then exits).
    """

    seq: int
    pool: Role
    current: int
    target: int
    # Why, as data: {"signal": "ttft_p90_ms", "observed": 812.0, "limit": 500.0, ...} rendered to text.
    reason: str = ""
    # Seconds since the epoch when decided (orchestrators ignore stale requests after a restart).
    time_s: float = 0.0


# --------------------------------------------------------------------------------------------------- errors


class ErrorReply(_Msg, frozen=True):
    request_id: str
    code: str
    message: str


Message = Union[
    RegisterWorker,
    RegisterAck,
    Heartbeat,
    Unregister,
    RouteRequest,
    Route,
    ListWorkers,
    WorkerList,
    Generate,
    Tokens,
    Abort,
    GetStats,
    WorkerStats,
    KvEvents,
    KvSnapshotRequest,
    KvSnapshot,
    RegisterTier,
    TierStore,
    TierStored,
    TierLookup,
    TierBlocks,
    TierStats,
    ScaleRequest,
    ErrorReply,
]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(msg: Message) -> bytes:
    return _encoder.encode(msg)


def decode(data: bytes) -> Message:
    """Decode one message; raises ``ProtocolError`` on anything that is not a known message."""
    from common.errors import ProtocolError

    try:
        return _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(f"undecodable message ({len(data)} bytes): {exc}") from exc
