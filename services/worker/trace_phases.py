"""A worker's phases of one request, for its trace spans (common/tracing.py): pure, from the times the worker and
its engine saw (monotonic seconds of this host).

A prefill-only request: prefill_queue (arrival to first scheduled), prefill (to its one token). A request whose
KV comes from a prefill worker: decode_queue (arrival to scheduled), transfer (to the KV landing), decode (to the
last token). A request prefilled here: decode_queue, prefill (to the first token), decode. An engine that does not
report when it scheduled the request (vLLM today) gets an empty queue phase and the whole wait in the next phase;
one that does not report the KV landing gets the transfer up to the first token; each such phase says so
(``splitserve.timing`` "unreported").
"""

from __future__ import annotations

import time

from common import tracing
from common.protocol import Generate
from common.tracing import Phase
from services.worker.engine import EngineOutput

UNREPORTED = {"splitserve.timing": "unreported"}


def worker_phases(prefill_only: bool, kv_transfer: bool, arrival_s: float, scheduled_s: float, loaded_s: float,
                  first_token_s: float, end_s: float, transfer_simulated: bool = False) -> list[Phase]:
    first_token_s = first_token_s or end_s
    queue_end_s = scheduled_s or arrival_s
    queue_attrs = {} if scheduled_s else UNREPORTED
    if prefill_only:
        return [Phase("prefill.queue", "prefill_queue", arrival_s, queue_end_s, queue_attrs),
                Phase("prefill", "prefill", queue_end_s, end_s)]
    phases = [Phase("decode.queue", "decode_queue", arrival_s, queue_end_s, queue_attrs)]
    if kv_transfer:
        landed_s = loaded_s or first_token_s
        attrs: dict[str, object] = {} if loaded_s else dict(UNREPORTED)
        if transfer_simulated:
            attrs["splitserve.simulated"] = True  # the mock engine's timing model, no byte moved
        phases += [Phase("kv.transfer", "transfer", queue_end_s, landed_s, attrs),
                   Phase("decode", "decode", landed_s, end_s)]
    else:
        phases += [Phase("prefill", "prefill", queue_end_s, first_token_s),
                   Phase("decode", "decode", first_token_s, end_s)]
    return phases



class RequestTrace:
    """One request's trace on this worker: the engine's first output timed as it passes, the spans recorded when
    the request ends. Off (no tracing, or the request carries no traceparent): the engine's outputs pass
    untouched and nothing is recorded."""

    def __init__(self, msg: Generate, transfer_simulated: bool) -> None:
        self.arrival_s = time.monotonic()
        self._msg = msg
        self._simulated = transfer_simulated
        self._on = bool(msg.traceparent) and tracing.enabled()
        self._first: tuple[float, float, float] | None = None  # (first output at, engine's scheduled_s, loaded_s)

    def seen(self, out: EngineOutput) -> None:
        """Each of the engine's outputs as it passes (the first one is timed)."""
        if self._on and self._first is None:
            self._first = (time.monotonic(), out.scheduled_s, out.loaded_s)

    def done(self, worker_id: str, outcome: str) -> None:
        if not self._on:
            return
        msg, end_s = self._msg, time.monotonic()
        first_s, scheduled_s, loaded_s = self._first or (0.0, 0.0, 0.0)
        pulled = msg.handoff is not None and msg.handoff.kv_transfer is not None
        phases = worker_phases(msg.prefill_only, pulled, self.arrival_s, scheduled_s, loaded_s, first_s, end_s,
                               self._simulated)
        kind = "prefill" if msg.prefill_only else "generate"
        tracing.record_remote(f"worker.{kind}", msg.traceparent, self.arrival_s, end_s, phases,
                              worker_id=worker_id, outcome=outcome)
