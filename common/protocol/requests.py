"""Frontend <-> router (route a request, list workers) and frontend <-> worker (generate, stream tokens, abort,
stats)."""

from __future__ import annotations

import msgspec

from common.protocol.base import FinishReason, Msg
from common.protocol.workers import (
    KvTransferParams,
    SamplingParams,
    TransferSample,
    WorkerInfo,
    WorkerLoad,
)

# ---------------------------------------------------------------------------------------- frontend <-> router


class RouteRequest(Msg, frozen=True):
    request_id: str
    model: str
    token_ids: tuple[int, ...]
    # The LoRA adapter the request runs with ("": the base model): only workers holding it are candidates, and
    # its prefixes are hashed under the adapter's seed (common/hashing.py: adapter_seed).
    lora_name: str = ""
    # Workers the frontend wants avoided (e.g. one that just failed this request).
    exclude_worker_ids: tuple[str, ...] = ()
    # Worker processes (WorkerInfo.instance_id) to avoid: the one a migrating request lost, not its restart.
    exclude_instance_ids: tuple[str, ...] = ()
    # W3C traceparent of the frontend's route span ("" = not traced): the router's span continues the trace.
    traceparent: str = ""


class WorkerRef(msgspec.Struct, frozen=True, omit_defaults=True):
    worker_id: str
    endpoint: str
    instance_id: str = ""


class Route(Msg, frozen=True):
    request_id: str
    decode: WorkerRef
    # None: the decode worker prefills locally.
    prefill: WorkerRef | None = None
    num_cached_tokens_predicted: int = 0
    # A kvtier on another host holding more of the prompt than the decode worker's own host's tier, worth
    # loading from (common/kvtier/sources.py): its endpoint, passed on in Generate ("" = none).
    kvtier_remote: str = ""


class ListWorkers(Msg, frozen=True):
    request_id: str


class WorkerList(Msg, frozen=True):
    request_id: str
    workers: tuple[WorkerInfo, ...]
    loads: tuple[WorkerLoad, ...]
    # Ids of listed workers that are draining: they finish what they hold and take nothing new.
    draining: tuple[str, ...] = ()


# --------------------------------------------------------------------------------------- frontend <-> worker


class Handoff(msgspec.Struct, frozen=True, omit_defaults=True):
    """The prefill worker's part of a request, handed to its decode worker (common/continuation.py says what
    the budget then counts): the first output token, streamed to the client already, and where the prompt's KV
    lives (None: the decode worker computes the prompt itself)."""

    first_token_id: int
    kv_transfer: KvTransferParams | None = None


class Generate(Msg, frozen=True):
    request_id: str
    # The prompt; with a hand-off, the prompt the prefill worker ran (the first token is the hand-off's).
    token_ids: tuple[int, ...]
    # The whole request's: max_tokens and min_tokens count every output token, the hand-off's first one too.
    sampling: SamplingParams
    # Prefill worker: compute the prompt, return the first token and where its KV lives.
    prefill_only: bool = False
    # Decode worker: continue after the prefill worker's first token, its prompt's KV pulled (or pushed) from
    # there when the hand-off says where.
    handoff: Handoff | None = None
    # Route.kvtier_remote: after the own kvtier's run, load the prompt's next blocks from this one.
    kvtier_remote: str = ""
    # W3C traceparent of the frontend's request span ("" = not traced): the worker's phase spans join its trace.
    traceparent: str = ""
    # Run with this LoRA adapter ("": the base model), on the prefill and the decode engine alike: the KV one
    # hands the other is the adapter's.
    lora_name: str = ""


class Tokens(Msg, frozen=True):
    """A streamed slice of output; the last one has finish_reason set."""

    request_id: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    # Set on a prefill-only request's final message.
    kv_transfer: KvTransferParams | None = None
    # Set when the request pulled KV remotely and the pull failed so the worker recomputed.
    transfer_failed: bool = False
    # One entry per token in token_ids when the request asked for logprobs.
    logprobs: tuple[TokenLogprobs, ...] = ()
    # SamplingParams.prompt_logprobs: on the request's first slice, one entry per prompt token after the first
    # (the first has no context to be scored in), each with its rank.
    prompt_logprobs: tuple[TokenLogprobs, ...] = ()


class TokensBatch(Msg, frozen=True):
    """Several requests' ``Tokens`` for one frontend in one frame, in the order the worker produced them: a
    worker's engine step yields a token for every running request, and one frame instead of one each saves a
    ZeroMQ send and receive per token on both sides. The receiver handles each item as if it came alone."""

    items: tuple[Tokens, ...]


class TokenLogprobs(msgspec.Struct, frozen=True, array_like=True):
    """The sampled token's logprob and the most likely alternatives, highest first, as (token id, logprob)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    # The token's rank in the distribution (1: the likeliest); 0: not reported (output tokens).
    rank: int = 0


class Abort(Msg, frozen=True):
    request_id: str


class GetStats(Msg, frozen=True):
    request_id: str


class WorkerStats(Msg, frozen=True):
    request_id: str
    worker_id: str
    load: WorkerLoad
    num_prefix_hits: int = 0
    num_transfers: int = 0
    num_transfer_failures: int = 0
    num_transfer_bytes: int = 0
    # Seconds spent in the transfers this worker initiated, summed (pull: the decode side's READs; push: the prefill
    # side's WRITEs; vLLM: NIXL telemetry xferDuration). GB/s = bytes / this.
    transfer_seconds_total: float = 0.0
    # NIXL descriptors those pulls posted, summed, after NIXL merged adjacent blocks (vLLM: telemetry descCount);
    # 0 where unknown (mock). Says which raw READ a transfer compares with: one per block, or one per region.
    num_transfer_descriptors: int = 0
    # The last transfers one by one (pulls READ here, pushes WRITTEN from here), oldest first (at most
    # services.worker.transfer_log.RECENT_TRANSFERS): sums hide whether a slow run was a few outliers or every one.
    recent_transfers: tuple[TransferSample, ...] = ()
    # The transfer counts, bytes and seconds above are the mock engine's simulation: no byte of them crossed a
    # wire (each recent sample says so too).
    transfers_simulated: bool = False
    # Prompt tokens by where their KV came from, cumulative (vLLM's scheduler accounting; 0 where unknown: mock):
    # computed here, hit in this engine's prefix cache, pulled from elsewhere (NIXL from a prefill worker, kvtier).
    # A decode worker that recomputes a prompt it should have pulled shows up here, not in the output.
    num_prompt_tokens_computed: int = 0
    num_prompt_tokens_cached: int = 0
    num_prompt_tokens_pulled: int = 0
