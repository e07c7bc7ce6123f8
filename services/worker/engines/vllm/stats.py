"""Collects vLLM's per-step scheduler and connector stats into the figures a worker reports.

vLLM's ``AsyncLLM`` calls every stat logger it was built with from its output loop (our event loop), once per
engine step that produced outputs. ``EngineStatsSink`` keeps the latest load and cumulative counters; the
engine reads them without touching vLLM. The stat classes are not a stable vLLM interface (checked: 0.32).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vllm.config import VllmConfig
from vllm.v1.metrics.loggers import StatLoggerBase
from vllm.v1.metrics.stats import IterationStats, SchedulerStats

from services.worker.engine import EngineCounters
from services.worker.engines.vllm.push_peers import DST_KEY
from services.worker.engines.vllm.tier.stats import LOADS_KEY
from services.worker.tier_load_log import TierLoadLog
from services.worker.transfer_log import TransferLog


@dataclass(frozen=True, slots=True)
class PromptTokenSources:
    """Cumulative prompt tokens by where their KV came from (vLLM's own accounting)."""

    num_computed: int = 0
    num_local_cache_hit: int = 0
    num_external_kv_transfer: int = 0


class EngineStatsSink:
    """Mutable accumulator fed by ``_SinkLogger``; read by ``VllmEngine``."""

    def __init__(self) -> None:
        self.num_running = 0  # vLLM's scheduler's, after its last step (in_engine_counts)
        # Fraction of KV blocks in use (0..1), from the scheduler.
        self.kv_cache_usage = 0.0
        self.num_prefix_hit_tokens = 0
        self.prompt_sources = PromptTokenSources()
        # NIXL connector stats: the transfers this engine initiated (pull: the decode side's READs; push: the
        # prefill side's WRITEs).
        self.transfers = TransferLog()
        self.num_transfer_failures = 0
        # kvtier connector loads (services/worker/engines/vllm/tier/stats.py), for the router's tier speeds.
        self.tier_loads = TierLoadLog()
        # Prompt tokens computed per second of prefill (WorkerLoad.prefill_tokens_per_s; 0: none measured yet).
        self.prefill_tokens_per_s = 0.0

    def record_scheduler(self, stats: SchedulerStats) -> None:
        self.num_running = stats.num_running_reqs
        self.kv_cache_usage = stats.kv_cache_usage
        self.num_prefix_hit_tokens += stats.prefix_cache_stats.hits
        if stats.kv_connector_stats:
            self._record_connector(stats.kv_connector_stats)

    def record_iteration(self, stats: IterationStats) -> None:
        tokens = stats.prompt_token_stats
        old = self.prompt_sources
        self.prompt_sources = PromptTokenSources(
            num_computed=old.num_computed + tokens.computed,
            num_local_cache_hit=old.num_local_cache_hit + tokens.local_cache_hit,
            num_external_kv_transfer=old.num_external_kv_transfer + tokens.external_kv_transfer,
        )
        for finished in stats.finished_requests:
            self.prefill_tokens_per_s = prefill_rate(self.prefill_tokens_per_s, finished.num_prompt_tokens
                                                     - finished.num_cached_tokens, finished.prefill_time)

    def _record_connector(self, data: dict[str, Any]) -> None:
        # NixlKVConnectorStats.data: lists with one entry per successful READ (durations in s) and one
        # entry per failure event. Other connectors use other keys; missing keys count as nothing.
        for value in data.values():
            if isinstance(value, dict):  # MultiConnector (NIXL + kvtier): each child's stats under its name
                self._record_connector(value)
        durations = data.get("transfer_duration", [])
        # One entry per transfer in each list, in the same order (vLLM's NixlKVConnectorStats.record_transfer): a
        # READ this engine pulled, or a WRITE it pushed, whose destination engine push_peers adds (DST_KEY).
        dsts = data.get(DST_KEY, [])
        for i, seconds in enumerate(durations):
            self.transfers.record(float(seconds), int(_at(data, "bytes_transferred", i)),
                                  int(_at(data, "num_descriptors", i)), float(_at(data, "post_duration", i)),
                                  dst_worker_id=str(dsts[i]) if i < len(dsts) else "")
        for tier, num_bytes, seconds in data.get(LOADS_KEY, []):
            self.tier_loads.record("disk" if tier == "disk" else "host", int(num_bytes), float(seconds))
        self.num_transfer_failures += sum(
            len(data.get(key, [])) for key in ("num_failed_transfers", "num_failed_handshakes")
        )

    def logger_factory(self) -> Callable[[VllmConfig, int], StatLoggerBase]:
        sink = self

        def factory(vllm_config: VllmConfig, engine_index: int = 0) -> StatLoggerBase:
            return _SinkLogger(sink)

        return factory

    def counters(self) -> EngineCounters:
        """Cumulative counters in the engine contract's shape (transfer seconds are handed out once)."""
        return EngineCounters(
            num_prefix_hits=self.num_prefix_hit_tokens,
            num_transfers=self.transfers.num_transfers,
            num_transfer_failures=self.num_transfer_failures,
            num_transfer_bytes=self.transfers.num_bytes,
            transfer_seconds=self.transfers.drain_seconds(),
            transfer_seconds_total=self.transfers.seconds_total,
            num_transfer_descriptors=self.transfers.num_descriptors,
            recent_transfers=self.transfers.recent(),
            recent_tier_loads=self.tier_loads.recent(),
            num_prompt_tokens_computed=self.prompt_sources.num_computed,
            num_prompt_tokens_cached=self.prompt_sources.num_local_cache_hit,
            num_prompt_tokens_pulled=self.prompt_sources.num_external_kv_transfer,
        )


# A prefill of fewer computed tokens measures per-step overhead, not a rate (a decode worker computes 1 of a pulled
# prompt); each measurement moves the average this much.
MIN_RATE_TOKENS = 32
RATE_WEIGHT = 0.2


def prefill_rate(old_tokens_per_s: float, num_computed_tokens: int, prefill_s: float) -> float:
    """The running prefill rate after one finished request: its computed prompt tokens over vLLM's prefill time
    (first scheduled to first token, so co-scheduled decode steps count: the rate this engine really prefills
    at). Unchanged for a prefill too short to measure."""
    if num_computed_tokens < MIN_RATE_TOKENS or not prefill_s > 0:
        return old_tokens_per_s
    rate = num_computed_tokens / prefill_s
    return rate if old_tokens_per_s <= 0 else (1 - RATE_WEIGHT) * old_tokens_per_s + RATE_WEIGHT * rate


def in_engine_counts(num_running: int, num_in_flight: int) -> tuple[int, int]:
    """(running, waiting) for the router: the ``num_in_flight`` requests this worker has in the engine, as many
    running as vLLM's scheduler says (``num_running``), the rest waiting.

    vLLM's counts are its scheduler's after the last step it finished: a request added since, or in its first
    step (a whole prefill long), is in neither, and an idle engine's last counts say 0. A heartbeat of those made
    the router forget the request it had just routed there, take the engine for one without streams, and prefill
    the next short prompt beside it: a 126-129 ms gap in that stream (shared prefixes, 2026-12-07). Requests in
    flight that vLLM does not count yet are waiting; counts left from requests gone are dropped."""
    running = min(num_running, num_in_flight)
    return running, num_in_flight - running


def _at(data: dict[str, Any], key: str, i: int) -> float:
    values = data.get(key, [])
    return values[i] if i < len(values) else 0


class _SinkLogger(StatLoggerBase):
    def __init__(self, sink: EngineStatsSink) -> None:
        self._sink = sink

    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        mm_cache_stats: object | None = None,
        engine_idx: int = 0,
    ) -> None:
        if scheduler_stats is not None:
            self._sink.record_scheduler(scheduler_stats)
        if iteration_stats is not None:
            self._sink.record_iteration(iteration_stats)

    def log_engine_initialized(self) -> None:
        pass
