"""What `up` runs: the graph's spec and each child's command line (pure, apart from picking free ports).

Each child is a plain `python -m cli.main <service>` command, the same one a systemd unit runs.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from cli.cpu_sched import engine_cores
from cli.http_limits import HttpLimits
from cli.placement import Placement
from cli.ports import free_port
from cli.tracing_setup import tracing_args
from services.planner import defaults as planner_defaults
from services.router.defaults import LOCAL_PREFILL_MAX_STALL_S, LOCAL_PREFILL_MAX_TOKENS

# `up`'s P/D KV transfer: pull, as the `worker` command's (services/worker/engine.py) and vLLM's own P/D. Push was
# `up`'s default until 2026-12-06 (long prompts' TTFT p50 -7% on bench/interference.py), but under push the decode
# engine is the transfer's target and runs a NIXL progress thread on its own core: side by side against vLLM's P/D
# (docs/measuring.md, "Pull or push"), pull's decode steps were the faster (TPOT p90 -2 to -5 ms), its first
# tokens 20-67 ms sooner, and shared prefixes went from 0.79-0.80x vLLM's goodput under push to 1.01-1.25x.
UP_KV_TRANSFER = "pull"


def up_kv_transfer(requested: str | None) -> str:
    """The KV transfer `up` gives its workers: ``requested``, else pull. Switchable vLLM workers (kv_both) can push:
    vLLM 0.32's NixlPushConnector acts per request, not per role (a prefill request's KV is written out, a decode
    request's blocks are registered), tested across a role switch in tests/e2e/test_roles_vllm.py."""
    return requested if requested is not None else UP_KV_TRANSFER

DEFAULT_MODEL_DIR = Path("models/tiny")


@dataclass(frozen=True)
class PlannerSpec:
    """`up --planner`: a planner process whose ScaleRequests this launcher carries out."""

    slo: str  # ttft_ms=..,itl_ms=..
    profile: Path | None = None
    interval_s: float = planner_defaults.INTERVAL_S
    window_s: float = planner_defaults.WINDOW_S
    max_prefill: int = planner_defaults.MAX_PREFILL
    max_decode: int = planner_defaults.MAX_DECODE
    max_workers: int = planner_defaults.MAX_WORKERS
    decisions_path: Path | None = None
    role_switch: bool = False  # move workers between pools in place before starting or draining any
    min_dwell_s: float = 30.0  # role_switch: a worker stays in a pool this long before it moves


@dataclass(frozen=True)
class ExtraModel:
    """A model served beside the first (`up --model A --model B`): its own pools, of the first's sizes, its own
    names (docs/fleet.md)."""

    model: Path
    served_model_names: tuple[str, ...]


@dataclass(frozen=True)
class GraphSpec:
    model: Path | None = None
    engine: str = "vllm"
    num_prefill: int = 1
    num_decode: int = 1
    num_aggregated: int = 0
    router_policy: str = "kv"
    num_routers: int = 1  # replicas; each worker and kvtier registers with every one
    # Each frontend hosts a router replica in its own process (`frontend --router-inside`) and routes without a
    # message; num_routers is then ignored: one replica a frontend, no router process.
    router_in_frontend: bool = False
    local_prefill_max_tokens: int = LOCAL_PREFILL_MAX_TOKENS
    local_prefill_max_stall_ms: float = LOCAL_PREFILL_MAX_STALL_S * 1e3
    block_size: int = 32
    num_blocks: int | None = None
    mock_speedup: float = 1.0
    mock_profile: Path | None = None  # mock timing from a `splitserve profile` JSON
    mock_start_s: float = 0.0  # seconds a mock engine takes to start
    mock_nixl: bool = False  # mock workers move real bytes with NIXL (pull)
    mock_block_bytes: int | None = None  # mock KV bytes per block (None: the mock's 36,864 per token)
    # The shared KV tier (kvtier): mock workers offload evicted blocks to it and onboard prefixes from it.
    kvtier: bool = True
    host_cache_gb: float = 1.0
    disk_cache_gb: float = 0.0
    disk_cache_dir: Path | None = None
    kvtier_metrics_port: int = 0  # 0: any free port (every service `up` starts serves Prometheus metrics)
    dtype: str = "auto"
    # How prefill workers' KV reaches decode workers: pull | push (every worker of the graph alike).
    kv_transfer: str = UP_KV_TRANSFER
    host: str = "127.0.0.1"
    port: int = 8000
    router_port: int = 0  # 0: any free port
    router_metrics_port: int = 0  # 0: any free port
    router_prefill_weight: float | None = None  # None: the router's default
    router_busy_threshold: float | None = None
    router_link_min_samples: int | None = None
    router_idle_decode_prefills: bool = True  # the router's --idle-decode-prefills
    log_level: str = "info"
    log_json: bool = False
    # Seconds to wait for /health to turn 200 (vLLM engines take seconds to a minute to start).
    ready_timeout_s: float = 300.0
    # Crashed children are restarted; more crashes than this in a minute stop the whole graph.
    max_restarts_per_min: int = 5
    planner: PlannerSpec | None = None  # None: fixed pools
    # Tokens a decode worker computes per step (0: the engine's default). Small values chunk its local
    # prefills over several steps, bounding the inter-token gap they cause to the decoding streams.
    decode_max_batched_tokens: int = 0
    # vLLM: frontend, router, kvtier and planner on control_plane_cores (never a decode engine's core).
    pin_control_plane: bool = True
    # Which processes run under SCHED_BATCH: auto, batch or normal (cli/cpu_sched.py).
    cpu_sched: str = "auto"
    # Prometheus file-SD target list, rewritten whenever a process starts, restarts or drains (None: default_sd_path).
    metrics_sd_file: Path | None = None
    # Frontend processes sharing the HTTP port (SO_REUSEPORT), each its own event loop.
    num_frontends: int = 1
    # Every frontend's HTTP limits (header bytes, timeouts, connections, body cap).
    http_limits: HttpLimits = HttpLimits()
    # CURVE on every socket (cli/graph_keys.py): fresh keys for this run, or a `keys make` root.
    curve: bool = False
    curve_dir: Path | None = None
    # Workers may move between the prefill and decode pools in place (SetRole); None: the engine's default.
    switchable: bool | None = None
    # Names clients use (the first is the one responses carry and workers register); (): the model's own name.
    served_model_names: tuple[str, ...] = ()
    # More models, each with pools of the sizes above (fixed: the planner scales the first model's), one frontend.
    extra_models: tuple[ExtraModel, ...] = ()
    # The first model's LoRA adapters, name=path, loaded by each of its workers at start (--lora-modules).
    lora_modules: tuple[str, ...] = ()
    # Passed to every frontend as is: --chat-template, --tool-call-parser, --reasoning-parser, the admission
    # queue's options, ... (cmd_up).
    frontend_args: tuple[str, ...] = ()
    # OTLP endpoint every frontend, router and worker sends trace spans to ("": no tracing).
    otlp_traces_endpoint: str = ""
    # vLLM engine arguments as typed (engine_args.py parses them): every worker's, then each pool's own after them
    # (argparse keeps the last value, so a pool's word wins over the common one).
    engine_args: tuple[str, ...] = ()
    prefill_engine_args: tuple[str, ...] = ()
    decode_engine_args: tuple[str, ...] = ()
    # `up --gpus`: each initial worker's devices, in worker_roles order (cli/placement.py); None: no placement
    # (every worker sees the machine's devices as `up` does).
    placement: Placement | None = None


def pool_engine_args(spec: GraphSpec, role: str) -> tuple[str, ...]:
    """A worker's vLLM engine arguments: the common ones, then its pool's (aggregated workers: the common ones)."""
    own = {"prefill": spec.prefill_engine_args, "decode": spec.decode_engine_args}.get(role, ())
    return (*spec.engine_args, *own)


def kvtier_command(spec: GraphSpec, router: str, endpoint: str) -> list[str]:
    cmd = ["kvtier", "--endpoint", endpoint, "--router", router, "--host-cache-gb", str(spec.host_cache_gb),
           "--disk-cache-gb", str(spec.disk_cache_gb), "--block-bytes", str(kvtier_block_bytes(spec))]
    cmd += ["--tier-id", "kvtier-0"]  # `up` runs one tier (kvtier's own default, kvtier-NODE, is per machine)
    if spec.disk_cache_dir is not None:
        cmd += ["--disk-cache-dir", str(spec.disk_cache_dir)]
    return cmd + ["--metrics-port", str(spec.kvtier_metrics_port or free_port())]


def kvtier_block_bytes(spec: GraphSpec) -> int:
    """kvtier's slot: one block of every layer's K and V. Mock: 36,864 KV bytes per token (its modelled ~100M
    engine, bf16). vLLM: from the model's config, 4 bytes per element when the engine is given float32, else 2:
    vLLM's `auto` keeps a 16-bit model's dtype and runs a float32 model (the tiny one) in bf16 on CPU, fp16/bf16
    on GPU (vLLM 0.32, ModelConfig's auto dtype)."""
    if spec.engine == "mock":
        return spec.mock_block_bytes or 36864 * spec.block_size
    from common.tiny_model import validate_model_dir
    from services.worker.engines.vllm.dtype import resolved_dtype

    info = validate_model_dir(spec.model or DEFAULT_MODEL_DIR)
    # As each engine resolves it (on a CPU without native bf16, `auto` is float32); "auto" left: the model's.
    dtype = resolved_dtype(spec.dtype, info.torch_dtype, on_cuda=shutil.which("nvidia-smi") is not None).dtype
    return info.kv_bytes_per_token(4 if dtype in ("float32", "float") else 2) * spec.block_size


def worker_command(spec: GraphSpec, model: Path, router: str, role: str, index: int, kvtier: str = "",
                   extra: ExtraModel | None = None) -> list[str]:
    """Worker ``index`` of the graph in ``role``: of the first model, or of ``extra``'s."""
    num_cores = os.cpu_count() or 1
    if extra is not None:
        model = extra.model
    cmd = ["worker", "--model", str(model), "--role", role, "--router", router, "--engine", spec.engine,
           "--block-size", str(spec.block_size), "--worker-id", f"{role}-{index}",
           "--mock-speedup", str(spec.mock_speedup), "--dtype", spec.dtype, "--kv-transfer", spec.kv_transfer,
           "--nixl-port", str(free_port()), "--core", str(index % num_cores), "--metrics-port", str(free_port())]
    if spec.num_blocks is not None:
        cmd += ["--num-blocks", str(spec.num_blocks)]
    if spec.mock_profile is not None:
        cmd += ["--mock-profile", str(spec.mock_profile)]
    if spec.mock_start_s:
        cmd += ["--mock-start-s", str(spec.mock_start_s)]
    if spec.mock_nixl:
        cmd += ["--mock-nixl"]
    if spec.mock_block_bytes:
        cmd += ["--mock-block-bytes", str(spec.mock_block_bytes)]
    if kvtier:
        cmd += ["--kvtier", kvtier]
    if spec.switchable is not None:
        cmd += ["--switchable" if spec.switchable else "--fixed-role"]
    if role == "decode" and spec.decode_max_batched_tokens:
        cmd += ["--max-num-batched-tokens", str(spec.decode_max_batched_tokens)]
    names = spec.served_model_names if extra is None else extra.served_model_names
    if names:
        cmd += ["--served-model-name", names[0]]
    if extra is None:
        cmd += [a for lora in spec.lora_modules for a in ("--lora-modules", lora)]
    cmd += tracing_args(spec.otlp_traces_endpoint)
    engine_args = pool_engine_args(spec, role)
    if spec.placement is not None and index < len(spec.placement.engines):
        placed = spec.placement.engines[index]
        cmd += ["--gpus", placed.cuda_visible_devices]
        if placed.gpu_memory_utilization is not None:  # engines sharing a device: their share of its memory
            engine_args = ("--gpu-memory-utilization", str(placed.gpu_memory_utilization), *engine_args)
    return [*cmd, "--", *engine_args] if engine_args else cmd


def worker_roles(spec: GraphSpec) -> list[str]:
    """Role of each initial worker; worker ``i`` is pinned to core ``i % num_cores`` (worker_command)."""
    return ["prefill"] * spec.num_prefill + ["decode"] * spec.num_decode + ["both"] * spec.num_aggregated


def worker_commands(spec: GraphSpec, model: Path, router: str, kvtier: str = "") -> list[list[str]]:
    """The first model's workers, then each extra model's (the same pools; ids and cores numbered on)."""
    roles = worker_roles(spec)
    cmds = [worker_command(spec, model, router, role, i, kvtier) for i, role in enumerate(roles)]
    for extra in spec.extra_models:
        for role in roles:
            cmds.append(worker_command(spec, model, router, role, len(cmds), kvtier, extra))
    return cmds


def control_plane_cores(roles: list[str], num_cores: int) -> frozenset[int]:
    """Cores for the frontend, router, kvtier and planner of a vLLM graph; empty: leave them unpinned.

    Decode latency is what disaggregation protects, so the control plane never shares a decode engine's core:
    it takes the cores no engine uses, else the prefill engines' (a prefill is throughput-bound; measured on
    2 cores, an unpinned frontend, router and client drifted onto the decode core whenever a long prefill held
    the other one). An aggregated graph with no free core has nowhere better: unpinned.
    """
    free = frozenset(range(num_cores)) - engine_cores(len(roles), num_cores)
    if free:
        return free
    prefill = {i % num_cores for i, role in enumerate(roles) if role == "prefill"}
    latency_bound = {i % num_cores for i, role in enumerate(roles) if role != "prefill"}  # decode, both
    return frozenset(prefill - latency_bound)


def router_command(spec: GraphSpec, endpoint: str, index: int = 0) -> list[str]:
    """Router replica ``index`` (``--router-metrics-port`` is the first one's; the others take free ports)."""
    metrics_port = spec.router_metrics_port if index == 0 else 0
    cmd = ["router", "--endpoint", endpoint, "--policy", spec.router_policy,
           "--local-prefill-max-tokens", str(spec.local_prefill_max_tokens),
           "--local-prefill-max-stall-ms", str(spec.local_prefill_max_stall_ms),
           "--metrics-port", str(metrics_port or free_port())]
    if spec.router_prefill_weight is not None:
        cmd += ["--prefill-weight", str(spec.router_prefill_weight)]
    if spec.router_busy_threshold is not None:
        cmd += ["--busy-threshold", str(spec.router_busy_threshold)]
    if spec.router_link_min_samples is not None:
        cmd += ["--link-min-samples", str(spec.router_link_min_samples)]
    if not spec.router_idle_decode_prefills:
        cmd.append("--no-idle-decode-prefills")
    return cmd + tracing_args(spec.otlp_traces_endpoint)


def frontend_commands(spec: GraphSpec, model: Path, router: str) -> list[list[str]]:
    """``num_frontends`` frontends on one port; more than one: each also on a metrics port of its own (on the
    shared port, /metrics answers from whichever process the kernel picked)."""
    cmd = ["frontend", "--model", str(model), "--router", router, "--host", spec.host, "--port", str(spec.port),
           *spec.http_limits.args(), *spec.frontend_args, *tracing_args(spec.otlp_traces_endpoint)]
    if spec.served_model_names or spec.extra_models:  # names pair with models in order: each model's given
        cmd += ["--served-model-name", ",".join(spec.served_model_names or (model.resolve().name,))]
    for extra in spec.extra_models:
        cmd += ["--model", str(extra.model), "--served-model-name", ",".join(extra.served_model_names)]
    if spec.num_frontends <= 1:
        return [cmd]
    return [[*cmd, "--metrics-port", str(free_port())] for _ in range(spec.num_frontends)]


def frontends_that_fit(num_cores: int, num_engines: int, num_other_services: int) -> int:
    """`up --frontends` default: as many frontends as the host's free cores, at least 1.

    ``num_cores``: cores this process may run on (its affinity). Each engine takes one (a vLLM engine is pinned to
    its own; a mock one is a busy process all the same), and so does each other busy service (router replicas,
    kvtier); the frontends get what is left. A frontend on a core an engine or the router also needs gains no
    rate and takes CPU from them.
    """
    return max(1, num_cores - num_engines - num_other_services)


def planner_command(spec: GraphSpec, router: str, events: str, metrics_urls: list[str] | None = None) -> list[str]:
    """``metrics_urls``: the frontends' /metrics (default: the one on the frontend's HTTP port)."""
    assert spec.planner is not None
    p = spec.planner
    urls = metrics_urls or [f"http://{spec.host}:{spec.port}/metrics"]
    cmd = ["planner", "--router", router, *[a for url in urls for a in ("--metrics-url", url)],
           "--events", events, "--slo", p.slo, "--interval-s", str(p.interval_s),
           "--window-s", str(p.window_s),
           "--max-prefill", str(p.max_prefill), "--max-decode", str(p.max_decode),
           "--max-workers", str(p.max_workers)]
    if p.profile is not None:
        cmd += ["--profile", str(p.profile)]
    if p.decisions_path is not None:
        cmd += ["--decisions", str(p.decisions_path)]
    if p.role_switch:
        cmd += ["--role-switch", "--min-dwell-s", str(p.min_dwell_s)]
    return cmd
