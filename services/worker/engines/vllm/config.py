"""A vLLM engine's settings (``VllmEngineConfig``) and the environment its worker process needs.

Environment (see ``engine_process_env``): LD_PRELOAD must be set before the worker process starts (the dynamic
loader reads it); the VLLM_* variables are read when vLLM starts its engine core and may be set in-process before
the engine starts.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from common.protocol import KvTransferMode
from services.worker.engine import DEFAULT_KV_TRANSFER

KvRole = Literal["prefill", "decode", "both"]


@dataclass(frozen=True, slots=True)
class VllmEngineConfig:
    model: Path
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    # Tokens per KV block; must match the router's hashing (docs/architecture.md#contracts). CPU attention needs a multiple of 32.
    block_size: int = 32
    # Caps KV blocks (vLLM num_gpu_blocks_override); None: as many as kv_cache_space_gib holds.
    num_blocks: int | None = None
    # None: the model's full context (vLLM's default), or what num_blocks holds.
    max_model_len: int | None = None
    # None: on CPU the defaults measured here (CPU_DEFAULTS in engine.py); on GPUs vLLM's own.
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    # None: eager on CPU (eager start takes seconds, compiled mode 40-90 s: docs/architecture.md#engines), vLLM's
    # compiled mode and CUDA graphs on GPUs.
    enforce_eager: bool | None = None
    # The user's own vLLM engine arguments (engine_args.py: by dest, as vLLM parsed them), applied over the
    # defaults above; the contract's own (KV connector, events, prefix caching) are refused before they get here.
    engine_args: Mapping[str, Any] = field(default_factory=dict)
    # The engine's devices (CUDA_VISIBLE_DEVICES) is the worker process's environment, set by its launcher.
    # NixlConnector role: prefill -> kv_producer, decode -> kv_consumer, both -> kv_both (either side of P/D;
    # vLLM 0.32 warns kv_both is deprecated). None: no connector (plain aggregated engine).
    kv_role: KvRole | None = "both"
    # The worker may move between prefill and decode in place (SetRole): the NIXL connector (pull or push) with
    # kv_both always, beside the kvtier connector when there is one (an aggregated "both" worker with kvtier uses
    # the tier's alone).
    switchable: bool = False
    # How KV moves between a prefill and a decode engine (vLLM 0.32's NIXL connectors): "pull", the decode engine
    # READs the prefill engine's blocks (NixlConnector); "push", the prefill engine WRITEs them into blocks the
    # decode engine allocated and registered with it (NixlPushConnector). Both engines of a pair use the same.
    kv_transfer: KvTransferMode = DEFAULT_KV_TRANSFER
    # Bind address of vLLM's NIXL side channel (the handshake socket decode engines dial; 0.0.0.0: every
    # interface) and the host decode engines are told to dial in our kv_transfer_params ("" = the bind address;
    # required when that is a wildcard). vLLM advertises its bind address as is; we rewrite it (params.py).
    nixl_side_channel_host: str = "127.0.0.1"
    nixl_advertise_host: str = ""
    # Must be free and distinct per engine on a host: a clash hangs the engine.
    nixl_side_channel_port: int = 5600
    # CPU KV cache size (VLLM_CPU_KVCACHE_SPACE), GiB.
    kv_cache_space_gib: int = 1
    enable_prefix_caching: bool = True
    # NIXL engine id other engines see in KvTransferParams.remote_engine_id; "" lets vLLM pick a uuid.
    engine_id: str = ""
    # Seconds a prefill engine keeps blocks for a decode engine that never pulls them.
    kv_lease_s: int = 30
    # vLLM's NixlConnector on CPU re-pins the model thread to the last core, and its UCX progress thread
    # busy-polls a whole core. False (default) undoes both in vLLM's worker process (services/worker/engines/vllm/nixl.py).
    nixl_progress_spin: bool = False
    # Publish vLLM's KV cache events, translated to our block hashes with this seed (docs/architecture.md#contracts).
    kv_events: bool = True
    hash_seed: int = 0
    # LoRA adapters loaded at start, (name, PEFT directory) (--lora-modules name=path; lora.py).
    lora_modules: tuple[tuple[str, str], ...] = ()
    # kvtier's endpoint: our KV connector (vllm_tier_connector) onboards prefixes from it and writes prompt
    # blocks through to it; alone for role "both", beside NixlConnector (MultiConnector) for prefill/decode.
    kvtier_endpoint: str = ""
    kvtier_write_through: bool = True
    # The worker's CURVE key directory (``keys make``'s OUT/worker), handed to the connector as a path ("" = plain).
    kvtier_curve_dir: str = ""
    # Where the engine's ipc:// socket files go (the worker's own directory, removed with it; "" = the temporary
    # directory, where a killed worker leaves them).
    socket_dir: str = ""


def engine_process_env(config: VllmEngineConfig, core_id: int | None) -> dict[str, str]:
    """Environment for a worker process running one vLLM engine.

    LD_PRELOAD (CPU: torch's libgomp, ~5x faster than two OpenMP runtimes) only works when set before the
    process starts. The rest can also be set in-process before the engine starts. ``core_id`` pins the
    engine's OpenMP threads to one core (CPU); None leaves binding to vLLM (GPU machines).
    """
    env = {
        "OMP_NUM_THREADS": "1",
        "VLLM_NIXL_SIDE_CHANNEL_HOST": config.nixl_side_channel_host,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(config.nixl_side_channel_port),
        "VLLM_CPU_KVCACHE_SPACE": str(config.kv_cache_space_gib),
        # torch's CPU allocator: 2 MiB-aligned, MADV_HUGEPAGE for buffers >= 2 MiB (the KV cache, activations).
        # Measured here (100M model bf16, 2,000-token prompts, P/D): NIXL READ of the prompt's KV 3.2-4.3 ->
        # 2.1-2.6 ms (CMA pins 512x fewer pages), prefill ~5% faster (60k page faults per prompt -> few).
        "THP_MEM_ALLOC_ENABLE": "1",
    }
    if core_id is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(core_id)
    libgomp = _torch_libgomp()
    if libgomp is not None:
        env["LD_PRELOAD"] = libgomp
    return env


def _torch_libgomp() -> str | None:
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "lib" / "libgomp.so.1"
    return str(path) if path.is_file() else None
