"""The mock engine's configuration: pool, batch limits, vocabulary, simulated timing, KV tier."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from common.protocol import KvTransferMode
from common.timing import TimingModel
from services.worker.engine import DEFAULT_KV_TRANSFER

if TYPE_CHECKING:
    from common.kvtier.client import TierBackend


@dataclass(frozen=True, slots=True)
class MockEngineConfig:
    num_blocks: int = 1024
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 4096
    vocab_size: int = 8192
    eos_token_id: int = 0
    # Seed of the block hashes (docs/architecture.md#contracts): model name, LoRA and cache salt mixed by the caller.
    hash_seed: int = 0
    # LoRA adapters held from the start (names only: --lora-modules); requests may name them.
    lora_names: tuple[str, ...] = ()
    timing: TimingModel = field(default_factory=TimingModel)
    # KV bytes per token, for simulated transfer sizes: 12 layers * (K + V) * 768 hidden * 2 bytes (bf16).
    kv_bytes_per_token: int = 36864
    # Named in the KvTransferParams a prefill_only request returns.
    engine_id: str = "mock"
    # False: eos_token_id (and every id in other_eos_token_ids) is never generated, so only max_tokens or a
    # user's stop id ends a request.
    emit_eos: bool = False
    # Models often have several end tokens (generation_config's eos_token_id list).
    other_eos_token_ids: tuple[int, ...] = ()
    # A shared KV tier (kvtier): evicted cached blocks are offloaded to it (with a deterministic stand-in
    # payload of kv_bytes_per_token * block_size bytes), and a new prompt's continuation of the local
    # prefix is onboarded from it (simulated transfer time) instead of recomputed. None: no tier.
    tier: TierBackend | None = None
    # Also offload every block as soon as prefill caches it (write-through), not only on eviction.
    tier_write_through: bool = False
    # Seconds start() takes, as a real engine loads weights and warms up (a profile's engine_start_s): what
    # starting a worker costs, for benchmarks that compare it with moving a running one between pools.
    start_s: float = 0.0
    # How a decode request's prompt KV arrives (as vLLM on CPU): "pull", a READ the decode engine runs inside
    # its step, so the step that starts it lasts the transfer's time longer (every sequence in it waits);
    # "push", the prefill engine WRITEs it, off the decode engine's steps (only the request itself waits).
    kv_transfer: KvTransferMode = DEFAULT_KV_TRANSFER
    # Real bytes (--mock-nixl): a NIXL-registered host region of num_blocks * kv_bytes_per_token * block_size
    # bytes; prefill blocks hold their content keys' bytes, decode engines READ and check them (pull only).
    nixl: bool = False
    # Seconds a prefill engine holds a prompt's blocks for a decode engine that never READs them (gone, cut off).
    nixl_hold_s: float = 30.0
    # Seconds a READ may take before it counts as failed (the prompt is then recomputed).
    nixl_timeout_s: float = 10.0
