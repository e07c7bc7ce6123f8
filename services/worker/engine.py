"""The contract between a worker's service loop and its engine (mock or vLLM).

The service owns sockets and dispatch; the engine owns the model, KV blocks and scheduling. One engine per
worker process. ``generate`` yields ``EngineOutput``s for one request until one has ``finish_reason`` set;
``abort`` ends a request early and frees every block it held.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import msgspec

from common.protocol import (
    FinishReason,
    Generate,
    Handoff,
    KvTransferMode,
    KvTransferParams,
    SamplingParams,
    TokenLogprobs,
    TierLoadSample,
    TransferSample,
    Role,
    WorkerInfo,
    WorkerLoad,
    WorkerStats,
)

if TYPE_CHECKING:
    from services.worker.config import WorkerConfig

# How a standalone engine or worker moves P/D KV unless told otherwise (`worker --kv-transfer`): pull, which works
# whatever address the side channel binds and keeps the decode engine's core free of a NIXL progress thread; `up`
# pulls too (cli/graph_spec.py, docs/measuring.md "Pull or push").
DEFAULT_KV_TRANSFER: KvTransferMode = "pull"
KV_TRANSFER_MODES: tuple[KvTransferMode, ...] = ("pull", "push")


# Prefix-cache changes an engine reports (the worker publishes them as KV events, in our block hashes).

@dataclass(frozen=True, slots=True)
class BlocksStored:
    # Chained hashes of blocks that just entered the cache, in sequence order.
    block_hashes: tuple[int, ...]
    # Hash of the block before the first one; None when the first one starts a sequence.
    parent_hash: int | None


@dataclass(frozen=True, slots=True)
class BlocksRemoved:
    block_hashes: tuple[int, ...]


KvEvent = BlocksStored | BlocksRemoved


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One request as ``Generate`` carries it. ``sampling`` is the whole request's: its budget counts every output
    token, a hand-off's first one too (common/continuation.py: the rule both engines implement)."""

    request_id: str
    token_ids: tuple[int, ...]  # the prompt (with a hand-off: the prompt the prefill worker ran)
    sampling: SamplingParams
    # Compute the prompt, produce its first output token only, keep the KV for a decode worker to pull.
    prefill_only: bool = False
    # Continue after the prefill worker's first token (emit only the tokens after it), the prompt's KV pulled
    # from the prefill worker when the hand-off says where, else computed here.
    handoff: Handoff | None = None
    # Another host's kvtier to load the prompt's blocks from after the own tier's (Generate.kvtier_remote).
    kvtier_remote: str = ""
    # Generate.traceparent: the request's trace, for engines that trace themselves (vLLM's trace_headers).
    traceparent: str = ""
    # The LoRA adapter to run with (one the engine holds); "": the base model.
    lora_name: str = ""

    @property
    def kv_transfer(self) -> KvTransferParams | None:
        """Where the prompt's KV comes from (a hand-off's), None: computed or loaded here."""
        return self.handoff.kv_transfer if self.handoff is not None else None

    @classmethod
    def of(cls, msg: Generate) -> EngineRequest:
        return cls(request_id=msg.request_id, token_ids=msg.token_ids, sampling=msg.sampling,
                   prefill_only=msg.prefill_only, handoff=msg.handoff, kvtier_remote=msg.kvtier_remote,
                   traceparent=msg.traceparent, lora_name=msg.lora_name)


class EngineOutput(msgspec.Struct, frozen=True):
    """One output of one request (a msgspec Struct: made per token on every engine, ~0.1 us to build against a
    frozen dataclass's ~1.6)."""

    request_id: str
    # New token ids since the previous output of this request.
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    # Prompt tokens whose KV came from the prefix cache (not from a transfer).
    num_cached_tokens: int = 0
    # Set on the final output of a prefill_only request.
    kv_transfer: KvTransferParams | None = None
    # A remote pull failed and the engine recomputed the prompt instead.
    transfer_failed: bool = False
    # One per token in token_ids when the request asked for logprobs (SamplingParams.logprobs).
    logprobs: tuple[TokenLogprobs, ...] = ()
    # SamplingParams.prompt_logprobs: on the first output, one per prompt token after the first (Tokens').
    prompt_logprobs: tuple[TokenLogprobs, ...] = ()
    # On the first output, engines that time their phases (mock): when the engine first scheduled the request
    # and when its pulled KV landed, monotonic seconds of this host; 0: not reported (the worker's trace spans).
    scheduled_s: float = 0.0
    loaded_s: float = 0.0


@dataclass(frozen=True, slots=True)
class EngineCounters:
    num_prefix_hits: int = 0
    num_transfers: int = 0
    num_transfer_failures: int = 0
    num_transfer_bytes: int = 0
    # Seconds spent pulling KV, one entry per finished transfer (drained by the service for metrics).
    transfer_seconds: tuple[float, ...] = field(default_factory=tuple)
    # Cumulative sum of every transfer's seconds (not drained), for GetStats.
    transfer_seconds_total: float = 0.0
    num_transfer_descriptors: int = 0
    # The last pulls one by one, oldest first (not drained), for GetStats.
    recent_transfers: tuple[TransferSample, ...] = ()
    # Prompt tokens computed / hit in the engine's prefix cache / pulled (see WorkerStats), cumulative.
    num_prompt_tokens_computed: int = 0
    num_prompt_tokens_cached: int = 0
    num_prompt_tokens_pulled: int = 0
    # The last loads from a KV tier one by one, oldest first (not drained; the heartbeat reports new ones once).
    recent_tier_loads: tuple[TierLoadSample, ...] = ()


def worker_stats(request_id: str, worker_id: str, load: WorkerLoad, c: EngineCounters,
                 recent_transfers: tuple[TransferSample, ...], simulated: bool) -> WorkerStats:
    """The GetStats answer from the engine's counters; ``recent_transfers``: theirs with each peer named."""
    return WorkerStats(
        request_id=request_id, worker_id=worker_id, load=load, num_prefix_hits=c.num_prefix_hits,
        num_transfers=c.num_transfers, num_transfer_failures=c.num_transfer_failures,
        num_transfer_bytes=c.num_transfer_bytes, transfer_seconds_total=c.transfer_seconds_total,
        num_transfer_descriptors=c.num_transfer_descriptors, recent_transfers=recent_transfers,
        transfers_simulated=simulated, num_prompt_tokens_computed=c.num_prompt_tokens_computed,
        num_prompt_tokens_cached=c.num_prompt_tokens_cached, num_prompt_tokens_pulled=c.num_prompt_tokens_pulled)


# Takes an output from inside the engine's step (no task switch per token): True when taken (services/worker/outputs.py).
OutputSink = Callable[[EngineOutput], bool]


class Engine(Protocol):
    block_size: int
    num_blocks: int
    max_model_len: int

    async def start(self) -> None:
        """Load the model and allocate KV; return when requests can be served."""

    def generate(self, request: EngineRequest, sink: OutputSink | None = None) -> AsyncIterator[EngineOutput]:
        """Run one request; yields outputs until the one with ``finish_reason``. An engine may hand an output to
        ``sink`` instead, from inside its step, and yields it only when ``sink`` returns False (after which it
        yields every later one too, so their order holds); ``sink`` never raises."""

    async def abort(self, request_id: str) -> None:
        """End a request now (client gone, stop string hit); frees its blocks. Unknown ids are ignored."""

    def load(self) -> WorkerLoad:
        """Current queue depths and KV usage, cheap enough to call every heartbeat."""

    def counters(self) -> EngineCounters:
        """Cumulative prefix-hit and transfer counters."""

    def settings(self) -> Mapping[str, str]:
        """The engine's configuration as it runs, by vLLM's names (vLLM: read back from its VllmConfig), for the
        worker's registration: operators and tests see what each engine really runs with."""

    def dead_reason(self) -> str:
        """Why the engine can serve nothing more ("" while it can): its engine process died, its step loop
        failed. Cheap: the worker asks every heartbeat, and exits when it is not "" (a dead engine does not
        come back; the worker's supervisor starts a fresh one)."""

    def lora_names(self) -> tuple[str, ...]:
        """The LoRA adapters this engine holds now, sorted (start-time ones and those loaded since)."""

    async def load_adapter(self, lora_name: str, lora_path: str) -> None:
        """Load a LoRA adapter (PEFT directory) under ``lora_name``; EngineError when it cannot."""

    async def unload_adapter(self, lora_name: str) -> None:
        """Unload an adapter; EngineError when it is not held. Requests running with it finish first (vLLM)."""

    async def shutdown(self) -> None:
        """Stop the engine and release its memory and ports."""


def worker_info(config: WorkerConfig, engine: Engine, role: Role, endpoint: str, instance_id: str,
                kv_events: bool) -> WorkerInfo:
    """What a worker registers with each router: who it is, where, and its engine's geometry as it runs."""
    return WorkerInfo(
        worker_id=config.worker_id, role=role, model=config.model, block_size=engine.block_size,
        num_blocks=engine.num_blocks, endpoint=endpoint, engine=config.engine_kind, hash_seed=config.hash_seed,
        max_model_len=engine.max_model_len, kv_events=kv_events, node=config.node, zone=config.zone,
        # Engines that know their KV geometry say it (mock, vLLM); others leave the router to its default.
        kv_bytes_per_token=getattr(engine, "kv_bytes_per_token", 0), instance_id=instance_id,
        switchable=config.switchable, engine_settings=dict(engine.settings()), lora_names=engine.lora_names())
