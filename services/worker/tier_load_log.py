"""Bookkeeping of one engine's finished KV tier loads: the recent loads one by one (``TierLoadSample``), and
which of them a heartbeat has not reported yet. Shared by the vLLM stats sink and the mock engine."""

from __future__ import annotations

from collections import deque

from common.protocol import TierLoadSample
from common.protocol.base import Tier

# A heartbeat interval's worth of loads at any realistic rate, at ~40 bytes each on the wire.
RECENT_TIER_LOADS = 256


class TierLoadLog:
    def __init__(self, max_recent: int = RECENT_TIER_LOADS, simulated: bool = False) -> None:
        self.num_loads = 0
        self.simulated = simulated  # every sample says so (the mock engine's log: the move is made up)
        self._recent: deque[TierLoadSample] = deque(maxlen=max_recent)

    def record(self, tier: Tier, num_bytes: int, seconds: float) -> None:
        self.num_loads += 1
        self._recent.append(TierLoadSample(seq=self.num_loads, tier=tier, num_bytes=num_bytes, seconds=seconds,
                                           simulated=self.simulated))

    def recent(self) -> tuple[TierLoadSample, ...]:
        """The last ``max_recent`` loads, oldest first."""
        return tuple(self._recent)


def slowest_tier(tiers: list[str]) -> Tier:
    """The tier a load of blocks from ``tiers`` is timed as: "disk" if any block came from disk, else "host"
    (a load takes as long as its slowest part; device blocks are never loaded)."""
    return "disk" if "disk" in tiers else "host"


class NewTierLoads:
    """Hands each load out once: the samples after the last call's (by ``seq``). Call once per heartbeat."""

    def __init__(self) -> None:
        self._last_seq = 0

    def take(self, recent: tuple[TierLoadSample, ...]) -> tuple[TierLoadSample, ...]:
        new = tuple(s for s in recent if s.seq > self._last_seq)
        if new:
            self._last_seq = new[-1].seq
        return new
