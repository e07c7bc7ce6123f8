"""Every message that crosses a process boundary.

Each message is a frozen, tagged ``msgspec.Struct`` encoded as msgpack. The tag is the class name, so a
decoder built over the ``Message`` union decodes any of them and ``match`` dispatches on the type.
Messages that expect a reply carry ``request_id``; replies echo it.

The messages live in one module per conversation (workers, requests, kv_events, kvtier, planner) and are all
re-exported here, so ``from common.protocol import X`` is the one import path; ``Message`` is their union.
"""

from __future__ import annotations

from typing import Union

import msgspec

from common.protocol.adapters import AdapterDone, LoadAdapter, UnloadAdapter
from common.protocol.base import (
    PROTOCOL_VERSION,
    ErrorReply,
    FinishReason,
    Msg,
    Role,
    Tier,
)
from common.protocol.kv_events import (
    AllCleared,
    BlockRemoved,
    BlockStored,
    KvEvent,
    KvEvents,
    KvSnapshot,
    KvSnapshotRequest,
    StoredBlock,
)
from common.protocol.kvtier import (
    RegisterTier,
    TierBlock,
    TierBlocks,
    TierLookup,
    TierStats,
    TierStore,
    TierStored,
)
from common.protocol.planner import RoleSet, ScaleRequest, SetRole
from common.protocol.requests import (
    Abort,
    Generate,
    GetStats,
    Handoff,
    ListWorkers,
    Route,
    RouteRequest,
    TokenLogprobs,
    Tokens,
    TokensBatch,
    TransferSample,
    WorkerList,
    WorkerRef,
    WorkerStats,
)
from common.protocol.workers import (
    Heartbeat,
    KvTransferMode,
    KvTransferParams,
    RegisterAck,
    RegisterWorker,
    SamplingParams,
    StructuredOutput,
    TierLoadSample,
    Unregister,
    WorkerInfo,
    WorkerLoad,
)

__all__ = [
    "Abort",
    "AdapterDone",
    "AllCleared",
    "BlockRemoved",
    "BlockStored",
    "ErrorReply",
    "FinishReason",
    "Generate",
    "GetStats",
    "Handoff",
    "Heartbeat",
    "KvEvent",
    "KvEvents",
    "KvSnapshot",
    "KvSnapshotRequest",
    "KvTransferMode",
    "KvTransferParams",
    "ListWorkers",
    "LoadAdapter",
    "Msg",
    "PROTOCOL_VERSION",
    "RegisterAck",
    "RegisterTier",
    "RegisterWorker",
    "Role",
    "RoleSet",
    "Route",
    "RouteRequest",
    "SamplingParams",
    "StructuredOutput",
    "ScaleRequest",
    "SetRole",
    "StoredBlock",
    "Tier",
    "TierBlock",
    "TierBlocks",
    "TierLookup",
    "TierStats",
    "TierStore",
    "TierStored",
    "TokenLogprobs",
    "Tokens",
    "TierLoadSample",
    "TokensBatch",
    "TransferSample",
    "Unregister",
    "UnloadAdapter",
    "WorkerInfo",
    "WorkerList",
    "WorkerLoad",
    "WorkerRef",
    "WorkerStats",
    "Message",
    "decode",
    "encode",
]

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
    TokensBatch,
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
    SetRole,
    RoleSet,
    LoadAdapter,
    UnloadAdapter,
    AdapterDone,
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
