"""Worker <-> router: what a worker is (WorkerInfo), registers, reports (Heartbeat, WorkerLoad); sampling and KV
transfer parameters that travel with its requests."""

from __future__ import annotations

from typing import Literal

import msgspec

from common.protocol.base import PROTOCOL_VERSION, Msg, Role, Tier  # noqa: F401  (PROTOCOL_VERSION: re-exported)

# --------------------------------------------------------------------------------------------- shared parts


class SamplingParams(msgspec.Struct, frozen=True, omit_defaults=True):
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    # The k most likely tokens only (0: all), and only tokens at least min_p times as likely as the likeliest.
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False
    # Token ids that end generation (the model's EOS ids and any the user asked for).
    stop_token_ids: tuple[int, ...] = ()
    # OpenAI / vLLM penalties (0 / 1.0: off): presence and frequency over output tokens, repetition over all.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # Token id -> bias added to its logit, in [-100, 100].
    logit_bias: dict[int, float] = {}
    # Stop ids cannot end generation before this many output tokens.
    min_tokens: int = 0
    # Return the sampled token's logprob and this many alternatives per token (None: no logprobs).
    logprobs: int | None = None
    # Guided decoding (vLLM structured outputs); None: free text.
    structured: StructuredOutput | None = None
    # Only these token ids may be sampled (empty: any).
    allowed_token_ids: tuple[int, ...] = ()
    # Token sequences that may never be completed (vLLM's bad_words, tokenized by the frontend as vLLM does:
    # each word with and without a leading space).
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()
    # Logprobs of each prompt token and this many alternatives (None: none), from the engine that computes the
    # prompt: such a request is prefilled where it decodes (docs/api.md).
    prompt_logprobs: int | None = None
    # vLLM's request priority: lower runs earlier (engines with priority scheduling; 0 for all: arrival order).
    priority: int = 0


class StructuredOutput(msgspec.Struct, frozen=True, omit_defaults=True):
    """A grammar the output must follow (vLLM's StructuredOutputsParams): exactly one of a JSON schema (as JSON
    text), any JSON object, a regular expression, one of ``choice``, an EBNF/Lark ``grammar`` or a structural
    tag (JSON text); with vLLM's per-request whitespace and additionalProperties options."""

    json_schema: str = ""
    json_object: bool = False
    regex: str = ""
    choice: tuple[str, ...] = ()
    grammar: str = ""
    structural_tag: str = ""
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str = ""


# How a prefilled request's KV reaches the decode engine: "pull" (the decode engine READs the prefill engine's
# blocks) or "push" (the decode engine registers blocks it allocated, the prefill engine WRITEs into them).
KvTransferMode = Literal["pull", "push"]


class KvTransferParams(msgspec.Struct, frozen=True, omit_defaults=True):
    """Where a prefilled request's KV lives and how to pull it (vLLM NixlConnector's fields, typed).

    A prefill worker returns these with its first token; the decode worker's engine pulls the blocks (``mode``
    "pull"), or registers its own blocks with the prefill engine, which writes the KV into them ("push").
    """

    remote_engine_id: str
    remote_block_ids: tuple[int, ...]
    # The prefill engine's NIXL side channel as decode engines dial it (its advertised host, never a wildcard);
    # "" from engines that move no bytes (mock).
    remote_host: str = ""
    remote_port: int = 0
    tp_size: int = 1
    # The prefill worker's id for the request, when the engine names it differently from ours.
    remote_request_id: str = ""
    # Bytes of KV behind remote_block_ids (for metrics and the mock engine's transfer time).
    num_bytes: int = 0
    # The prefill engine's transfer mode; a decode engine of the other mode refuses the request (the two vLLM
    # connectors cannot talk to each other).
    mode: KvTransferMode = "pull"
    # The mock engine with real bytes (`--mock-nixl`; services/worker/engines/mock/nixl_kv.py): the prefill engine's
    # NIXL agent metadata (what the decode engine's agent adds, ~0.5 KB), the address of its registered KV region and
    # one block's bytes there (block b at nixl_base_addr + b * nixl_block_bytes). The decode engine READs
    # remote_block_ids and notifies remote_request_id, the prefill engine's name for the held blocks, when done.
    # Empty/0 from engines that move no mock bytes (vLLM's own connector has its side channel instead).
    nixl_metadata: bytes = b""
    nixl_base_addr: int = 0
    nixl_block_bytes: int = 0


class WorkerLoad(msgspec.Struct, frozen=True, omit_defaults=True):
    num_running: int = 0
    num_waiting: int = 0
    num_free_blocks: int = 0
    num_total_blocks: int = 0
    # Blocks held by sequences that are decoding (the router's load term).
    num_active_blocks: int = 0
    # Prompt tokens queued for prefill (waiting requests, and the rest of chunked prefills); -1: the engine
    # does not count them (the router then estimates from num_waiting).
    num_waiting_tokens: int = -1
    # Prefill throughput the engine measured lately, tokens/s; 0: not measured (the router uses its default).
    prefill_tokens_per_s: float = 0.0


class WorkerInfo(msgspec.Struct, frozen=True, omit_defaults=True):
    worker_id: str
    role: Role
    model: str
    block_size: int
    num_blocks: int
    # ZeroMQ endpoint of the worker's ROUTER socket for generate requests.
    endpoint: str
    engine: str = "mock"
    # Seed mixed into block hashes (docs/architecture.md#contracts); workers of one model must agree.
    hash_seed: int = 0
    max_model_len: int = 0
    # The engine publishes KV events; without them the router indexes its own decisions (approximate mode).
    kv_events: bool = False
    # Where the worker runs: a machine name (default its hostname) and an optional failure/network zone. The
    # router prices KV moves between nodes by the link between them (same node: shared memory, no wire).
    node: str = ""
    zone: str = ""
    # Bytes of KV one token occupies on this engine (all layers, K and V); 0: unknown. The router prices a
    # prefilled prompt's move at num_tokens * this over the link.
    kv_bytes_per_token: int = 0
    # Random per process start: a restarted worker keeps its worker_id but not this, so a frontend migrating
    # away from a dead worker excludes that process, never its successor.
    instance_id: str = ""
    # The engine serves either side of P/D (vLLM kv_both, the mock engine): the router may move it between the
    # prefill and decode pools in place (SetRole) instead of the planner restarting it.
    switchable: bool = False
    # The engine's configuration as it runs, by vLLM's names (max_model_len, tensor_parallel_size, enforce_eager,
    # ...): what `splitserve router workers` shows.
    engine_settings: dict[str, str] = msgspec.field(default_factory=dict)
    # The LoRA adapters the engine holds (--lora-modules, then LoadAdapter/UnloadAdapter; heartbeats update it).
    lora_names: tuple[str, ...] = ()


class TransferSample(msgspec.Struct, frozen=True, omit_defaults=True):
    """One finished KV transfer, as its NIXL initiator timed it: a pull's READ, timed by the decode engine, or a
    push's WRITE, timed by the prefill engine (vLLM: NIXL's telemetry of the one transfer). Either way bytes
    moved over post-to-completion seconds from ``src_worker_id`` to ``dst_worker_id``: what the router learns
    a link's bandwidth from."""

    seq: int  # 1-based: this was the worker's seq-th transfer (compare with WorkerStats.num_transfers)
    seconds: float  # post to completion
    num_bytes: int
    num_descriptors: int = 0  # after NIXL merged adjacent blocks; 0 where unknown (mock)
    post_seconds: float = 0.0  # inside the post call (NIXL on CPU copies there); 0 where unknown
    # Worker the KV came from (a pull: KvTransferParams.remote_engine_id = the prefill worker's id; a push: the
    # reporting worker itself); "" unknown.
    src_worker_id: str = ""
    # Worker the KV was written into (a push: the decode engine that registered its blocks; vLLM names it by its
    # engine id = worker id). "": a pull, whose destination is the reporting worker.
    dst_worker_id: str = ""
    # The mock engine made it up (bytes from its KV geometry, seconds from its timing model): no byte crossed a
    # wire, so the router learns no link from it (services/router/transfer_samples.py).
    simulated: bool = False


class TierLoadSample(msgspec.Struct, frozen=True, omit_defaults=True):
    """One finished load of prompt KV from a KV tier (kvtier) into the engine, as the engine timed it: lookup,
    READ/copy and checks (vLLM: the kvtier connector's ``kvtier_loaded``; mock: its lookup plus simulated move).
    The router learns each tier's bytes/s and latency from them (services/router/tier_speeds.py)."""

    seq: int  # 1-based: this was the worker's seq-th tier load
    tier: Tier  # the slowest tier the load's blocks came from ("disk" if any did, else "host")
    num_bytes: int
    seconds: float
    # The mock engine's: a real lookup plus a made-up move of stand-in bytes, so the router learns no tier
    # speed from it.
    simulated: bool = False


# ------------------------------------------------------------------------------------------ worker <-> router


class RegisterWorker(Msg, frozen=True):
    request_id: str
    info: WorkerInfo
    # PROTOCOL_VERSION of the sender; 0 = a release from before versions were sent.
    protocol_version: int = 0


class RegisterAck(Msg, frozen=True):
    request_id: str
    worker_id: str
    # Where the worker's PUB socket connects to publish KvEvents ("" = the router takes no events).
    events_endpoint: str = ""


class Heartbeat(Msg, frozen=True):
    worker_id: str
    load: WorkerLoad
    # Heartbeats are numbered so the router can tell a restarted worker from a late packet.
    seq: int = 0
    # The worker is draining (SIGTERM or a scale-down): route nothing new to it; it exits once idle.
    draining: bool = False
    # KV transfers this worker initiated since the previous heartbeat (pulls it READ, pushes it WROTE), oldest
    # first (the router learns link bandwidths from them).
    transfers: tuple[TransferSample, ...] = ()
    # The worker's role now (it is the source of truth: a SetRole moves it and every router follows its beats;
    # a router that restarts learns it from the registration). "": an older worker, role as registered.
    role: Role | Literal[""] = ""
    # Tier loads finished since the previous heartbeat, oldest first (the router learns tier speeds from them).
    tier_loads: tuple[TierLoadSample, ...] = ()
    # The LoRA adapters the engine holds now (a LoadAdapter or UnloadAdapter changed them); None: as registered.
    lora_names: tuple[str, ...] | None = None


class Unregister(Msg, frozen=True):
    worker_id: str
