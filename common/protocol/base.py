"""The parts every message module shares: the tagged base class, the protocol version, small literal types."""

from __future__ import annotations

from typing import Literal

import msgspec

# The wire contract's release: bumped whenever a message changes incompatibly. Registrations carry it and the router
# refuses a peer of another version loudly (a field it does not know would otherwise be silently misread).
PROTOCOL_VERSION = 5  # 5: Generate.handoff (the first token and its KV) replaced kv_transfer

Role = Literal["prefill", "decode", "both"]
Tier = Literal["device", "host", "disk"]
FinishReason = Literal["stop", "length", "abort", "error"]


class Msg(msgspec.Struct, frozen=True, tag=True, array_like=False, omit_defaults=True):
    pass


class ErrorReply(Msg, frozen=True):
    request_id: str
    code: str
    message: str
