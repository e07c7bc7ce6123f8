"""The router's view of its kvtier processes (shared KV sources): each one's registration and last heartbeat.

Pure bookkeeping with an injected clock, as ``registry.Registry`` is for workers. A tier's blocks are the
prefix index's (``PrefixIndex.mark_shared``); this only says which tiers are alive and where they are.
"""

from __future__ import annotations

from common.protocol import RegisterTier


class TierRegistry:
    def __init__(self) -> None:
        self.last_seen_s: dict[str, float] = {}  # tier id -> last heartbeat or registration (monotonic s)
        self.info: dict[str, RegisterTier] = {}  # tier id -> its registration as sent (endpoint, node, zone)

    def __contains__(self, tier_id: str) -> bool:
        return tier_id in self.last_seen_s

    def __bool__(self) -> bool:
        return bool(self.last_seen_s)

    def register(self, msg: RegisterTier, now_s: float) -> None:
        self.last_seen_s[msg.tier_id] = now_s
        self.info[msg.tier_id] = msg

    def beat(self, tier_id: str, now_s: float) -> None:
        self.last_seen_s[tier_id] = now_s

    def expire(self, now_s: float, timeout_s: float) -> list[str]:
        """Tiers silent for more than ``timeout_s``, forgotten here; the caller drops their blocks."""
        dead = [t for t, seen in self.last_seen_s.items() if now_s - seen > timeout_s]
        for tier_id in dead:
            del self.last_seen_s[tier_id]
            self.info.pop(tier_id, None)
        return dead
