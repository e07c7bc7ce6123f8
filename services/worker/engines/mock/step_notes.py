"""What the mock engine notes about its steps: the prefill rate it reports (WorkerLoad.prefill_tokens_per_s) and
when each request was first scheduled and its KV landed (EngineOutput.scheduled_s / loaded_s: trace phases)."""

from __future__ import annotations

import itertools
import time

from services.worker.engines.mock.scheduler import StepPlan

# Steps that prefill fewer tokens than this do not count toward the reported prefill rate.
_MIN_RATE_TOKENS = 128


class StepNotes:
    def __init__(self) -> None:
        # Prefill tokens/s of recent steps that prefilled (EMA over their scaled step seconds); 0 until one ran.
        self.prefill_tokens_per_s = 0.0
        self._scheduled_s: dict[str, float] = {}  # request id -> monotonic s it was first scheduled
        self._loaded_s: dict[str, float] = {}  # request id -> monotonic s its KV load landed

    def prefill_step(self, num_prefill_tokens: int, step_s: float) -> None:
        """Fold one step into the reported prefill rate (a mixed step's decode share counts against it, as on
        a real engine). Steps of no simulated time, and the one-token "prefills" that follow a KV pull (a decode
        step's worth of time for one token), say nothing about prefill throughput."""
        if num_prefill_tokens < _MIN_RATE_TOKENS or step_s <= 0:
            return
        rate = num_prefill_tokens / step_s
        old = self.prefill_tokens_per_s
        self.prefill_tokens_per_s = rate if old == 0 else 0.8 * old + 0.2 * rate

    def scheduled(self, plan: StepPlan) -> None:
        for seq_id in itertools.chain((c.seq_id for c in plan.prefills), (load.seq_id for load in plan.loads)):
            self._scheduled_s.setdefault(seq_id, time.monotonic())

    def landed(self, seq_id: str) -> None:
        self._loaded_s[seq_id] = time.monotonic()

    def take(self, seq_id: str) -> tuple[float, float]:
        """(scheduled_s, loaded_s) of a request's first output (0: none), forgotten after."""
        return self._scheduled_s.pop(seq_id, 0.0), self._loaded_s.pop(seq_id, 0.0)

    def forget(self, seq_id: str) -> None:
        self._scheduled_s.pop(seq_id, None)
        self._loaded_s.pop(seq_id, None)
