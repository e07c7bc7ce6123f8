"""Which pulls a heartbeat reports, and from which worker each one pulled.

The router learns link bandwidths from them, per (source node, this node). The mock engine names each pull's
source (``TransferSample.src_worker_id``); vLLM's NIXL telemetry does not (one entry per READ, no request or
peer). Such a pull is attributed when it can only have come from one worker: every request that was pulling
during this heartbeat interval or the one before named the same ``remote_engine_id`` (a prefill worker's id).
Otherwise it stays unattributed and the router learns nothing from it: a wrong source would teach a wrong link.
Sources filled in are remembered, so GetStats shows them as heartbeats sent them.

A push is the other way round: the prefill engine initiates the WRITE and reports it, its destination named
(``dst_worker_id``: vLLM's decode engine id, tagged on by services/worker/engines/vllm/push_peers.py). Its source
is this worker, never a guess from the pulls around it.
"""

from __future__ import annotations

from collections import OrderedDict

import msgspec

from common.protocol import TransferSample
from services.worker.transfer_log import RECENT_TRANSFERS


class TransferSources:
    def __init__(self, worker_id: str = "") -> None:
        self._worker_id = worker_id  # the source of every push this worker reports
        self._pulling: dict[str, str] = {}  # request id -> remote_engine_id, from Generate to its first output
        self._this_interval: set[str] = set()
        self._last_interval: set[str] = set()
        self._last_seq = 0
        # Sources filled in so far, by sample seq (as many as WorkerStats shows), for GetStats to show them too.
        self._filled: OrderedDict[int, str] = OrderedDict()

    def started(self, request_id: str, src_worker_id: str) -> None:
        self._pulling[request_id] = src_worker_id
        self._this_interval.add(src_worker_id)

    def finished(self, request_id: str) -> None:
        """The request's pull is over (its first output came, or it ended): no later sample is its."""
        self._pulling.pop(request_id, None)

    def new_samples(self, recent: tuple[TransferSample, ...]) -> tuple[TransferSample, ...]:
        """Samples after the last call's (by ``seq``), a source filled in where only one is possible. Call once
        per heartbeat: each call closes an interval."""
        new = [self._pushed_from_here(s) for s in recent if s.seq > self._last_seq]
        if new:
            self._last_seq = new[-1].seq
        sources = self._this_interval | self._last_interval | set(self._pulling.values())
        only = next(iter(sources)) if len(sources) == 1 else ""
        self._last_interval, self._this_interval = self._this_interval, set(self._pulling.values())
        if not only:
            return tuple(new)
        for s in new:
            if not s.src_worker_id and not s.dst_worker_id:  # a pull's source; a push's is this worker
                self._filled[s.seq] = only
        while len(self._filled) > RECENT_TRANSFERS:
            self._filled.popitem(last=False)
        return self.named(tuple(new))

    def named(self, samples: tuple[TransferSample, ...]) -> tuple[TransferSample, ...]:
        """``samples`` with the sources filled in by earlier ``new_samples`` calls."""
        filled = self._filled
        return tuple(msgspec.structs.replace(s, src_worker_id=filled[s.seq])
                     if not s.src_worker_id and s.seq in filled else self._pushed_from_here(s) for s in samples)

    def _pushed_from_here(self, sample: TransferSample) -> TransferSample:
        if sample.dst_worker_id and not sample.src_worker_id and self._worker_id:
            return msgspec.structs.replace(sample, src_worker_id=self._worker_id)
        return sample
