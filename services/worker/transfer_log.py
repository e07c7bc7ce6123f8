"""Bookkeeping of the KV transfers one engine initiated (pulls it READ; pushes it WROTE): cumulative counts, the
recent ones one by one, and the seconds of each handed to the metrics once. Shared by the vLLM stats sink and the
mock engine."""

from __future__ import annotations

from collections import deque

from common.protocol import TransferSample

# Enough for a benchmark phase (a long prompt every few seconds for a minute) at a few KB in a WorkerStats.
RECENT_TRANSFERS = 256


class TransferLog:
    def __init__(self, max_recent: int = RECENT_TRANSFERS, simulated: bool = False) -> None:
        # Every sample says it was simulated (the mock engine's log): nothing moved on a wire.
        self.simulated = simulated
        self.num_transfers = 0
        self.num_bytes = 0
        self.num_descriptors = 0
        self.seconds_total = 0.0
        self._recent: deque[TransferSample] = deque(maxlen=max_recent)
        self._undrained_s: list[float] = []

    def record(self, seconds: float, num_bytes: int, num_descriptors: int = 0, post_seconds: float = 0.0,
               src_worker_id: str = "", dst_worker_id: str = "") -> None:
        self.num_transfers += 1
        self.num_bytes += num_bytes
        self.num_descriptors += num_descriptors
        self.seconds_total += seconds
        self._recent.append(TransferSample(seq=self.num_transfers, seconds=seconds, num_bytes=num_bytes,
                                           num_descriptors=num_descriptors, post_seconds=post_seconds,
                                           src_worker_id=src_worker_id, dst_worker_id=dst_worker_id,
                                           simulated=self.simulated))
        self._undrained_s.append(seconds)

    def recent(self) -> tuple[TransferSample, ...]:
        """The last ``max_recent`` transfers, oldest first."""
        return tuple(self._recent)

    def drain_seconds(self) -> tuple[float, ...]:
        """Each pull's seconds since the previous call (for a histogram: every pull observed once)."""
        drained, self._undrained_s = tuple(self._undrained_s), []
        return drained
