"""`splitserve worker`: one engine (mock or vLLM) behind a socket, registered with the router."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Optional

import typer

from cli.logs import configure_logging
from cli.options import (
    DEFAULT_ROUTER,
    DTYPE_HELP,
    CurveDir,
    KvTransfer,
    LogJson,
    LogLevel,
    MetricsHost,
    Node,
    Zone,
    address_checked,
    LORA_MODULES_HELP,
    SERVED_NAME_HELP,
    curve_key_dir,
    default_node,
    kv_transfer_checked,
    lora_modules,
    mock_kv_bytes_per_token,
    reexec_with_engine_env,
    resolved_model,
    served_names,
    transport,
    validated,
)
from cli.runner import run_service
from cli.tracing_setup import OtlpTracesEndpoint, configure_tracing

# The worker's exit status when its engine died under it (2 is a usage error; 1 any other crash).
ENGINE_DEAD_EXIT_CODE = 3


def worker(
    ctx: typer.Context,
    model: str = typer.Option(..., help="HF model directory, or a Hugging Face id in the local cache (HF_HOME)"),
    role: str = typer.Option("both", help="prefill | decode | both (the role at start: see --switchable)"),
    switchable: Optional[bool] = typer.Option(
        None, "--switchable/--fixed-role", help="Routers may move this worker between the prefill and decode "
        "pools in place (SetRole, `splitserve router set-role`); its engine then serves both sides of P/D (vLLM: "
        "its NIXL connector, pull or push, with kv_both; one batch budget for both). Default: mock yes, vLLM no"),
    router_endpoint: str = typer.Option(DEFAULT_ROUTER, "--router", envvar="SPLITSERVE_ROUTER",
                                        help="Router endpoint, or replicas comma-separated (registers with each)"),
    endpoint: str = typer.Option("tcp://127.0.0.1:0", help="ZeroMQ bind address for requests"),
    advertise_endpoint: Optional[str] = typer.Option(
        None, "--advertise", help="What frontends on other hosts dial, registered with the router: an endpoint "
        "(tcp://10.0.0.5:5560) or a host (10.0.0.5: the bound port on it). Needed when --endpoint binds 0.0.0.0; "
        "a wildcard is refused"),
    node: Optional[str] = Node,
    zone: str = Zone,
    served_model_name: Optional[str] = typer.Option(None, help=SERVED_NAME_HELP),
    lora_modules_given: Optional[list[str]] = typer.Option(None, "--lora-modules", help=LORA_MODULES_HELP),
    worker_id: Optional[str] = typer.Option(None, help="Unique in the cluster (default: ROLE-NODE-PID)"),
    engine: str = typer.Option("mock", help="mock | vllm"),
    block_size: int = typer.Option(32, help="Tokens per KV block (vLLM on CPU needs a multiple of 32)"),
    num_blocks: Optional[int] = typer.Option(None, help="KV blocks (mock default 2048; vLLM: from memory)"),
    max_num_seqs: Optional[int] = typer.Option(None, help="Sequences per step (default: mock and vLLM on CPU 64; "
                                               "GPUs: vLLM's)"),
    max_num_batched_tokens: Optional[int] = typer.Option(None, help="Tokens per step (default: mock and vLLM on "
                                                         "CPU 2048; GPUs: vLLM's)"),
    mock_speedup: float = typer.Option(1.0, help="Mock timing divided by this; inf = no delay"),
    mock_profile: Optional[Path] = typer.Option(None, help="Mock timing fitted from this `splitserve profile` JSON"),
    mock_start_s: float = typer.Option(0.0, help="Mock: seconds its engine takes to start (as a real one loads)"),
    mock_nixl: bool = typer.Option(False, help="Mock: move real bytes with NIXL (a registered host region of "
                                   "--num-blocks x block bytes; decode READs and checks them; pull only). "
                                   "Without it the mock's transfers are simulated"),
    mock_block_bytes: Optional[int] = typer.Option(None, help="Mock: KV bytes of one block, a multiple of "
                                                   "--block-size (default 36,864 per token: a ~100M bf16 model)"),
    mock_nixl_hold_s: float = typer.Option(30.0, help="Mock with --mock-nixl: seconds a prefill holds a prompt's "
                                           "blocks for a decode worker that never reads them"),
    kvtier: str = typer.Option("", "--kvtier", envvar="SPLITSERVE_KVTIER",
                               help="This node's kvtier (one per node): offload KV blocks there and onboard "
                               "prefixes from it (vLLM: through our KV connector, "
                               "services/worker/engines/vllm/tier/connector.py)"),
    kvtier_write_through: Optional[bool] = typer.Option(
        None, help="Offload blocks right after prefill (default: mock no, on eviction only; vLLM yes: its "
        "connector API does not expose evictions, so write-through is its only save path)"),
    dtype: str = typer.Option("auto", help=DTYPE_HELP),
    kv_transfer: str = KvTransfer,
    nixl_port: int = typer.Option(5600, help="vLLM: NIXL side-channel port, distinct per engine on a host"),
    nixl_host: str = typer.Option("127.0.0.1", help="vLLM: bind address of the NIXL side channel (the "
                                  "handshake socket decode engines dial; 0.0.0.0: every interface)"),
    nixl_advertise: str = typer.Option("", help="vLLM: host decode engines on other hosts dial for the side "
                                       "channel (default: --nixl-host, or when that is 0.0.0.0/:: the host of "
                                       "--advertise)"),
    kv_cache_gib: int = typer.Option(1, help="vLLM on CPU: KV cache space"),
    core: Optional[int] = typer.Option(None, help="vLLM on CPU: pin the engine's threads to this core"),
    gpus: Optional[str] = typer.Option(None, help="vLLM: this engine's GPUs, 0-7 | 0,1,3 | all (its CUDA_VISIBLE_"
                                       "DEVICES: the first tensor x pipeline parallel of them); default: those "
                                       "this process sees"),
    metrics_port: int = typer.Option(0, help="Prometheus port (0: none)"),
    metrics_host: str = MetricsHost,
    drain_timeout_s: float = typer.Option(30.0, help="On SIGTERM: finish requests for at most this long, then exit"),
    engine_args_text: str = typer.Option(
        "", "--engine-args", envvar="SPLITSERVE_ENGINE_ARGS",
        help="vLLM engine arguments as one string (for deploy files: compose, Kubernetes and systemd set each pool's "
             "in the environment); the command line's own engine arguments win"),
    curve_dir: Optional[Path] = CurveDir,
    otlp_traces_endpoint: str = OtlpTracesEndpoint,
    log_level: str = LogLevel,
    log_json: bool = LogJson,
) -> None:
    """Run one worker: an engine (mock or vLLM) behind a socket, registered with the router.

    Every other option is a vLLM engine argument under vLLM's own name, e.g. `splitserve worker --model M
    --engine vllm -- --max-model-len 32768 -tp 2 --kv-cache-dtype fp8` (`--` is optional; `--config FILE.yaml` for
    these and the worker's own options, as in `vllm serve`; SPLITSERVE_ENGINE_ARGS in deploy files): vLLM's parser checks them, and a bad one is its error. The KV connector, KV events and
    prefix caching are the worker's (refused with the reason)."""
    from common.hashing import hash_seed
    from common.model_identity import model_identity
    from services.worker.engines.vllm.engine_args import (
        NO_ENGINE_ARGS,
        SHARED_ARGS,
        EngineArgs,
        EngineArgsError,
        parse_engine_args,
    )
    from services.worker.config import WorkerConfig
    from services.worker.service import WorkerService

    configure_logging(log_level, log_json, f"worker-{role}")
    configure_tracing(otlp_traces_endpoint, f"worker-{role}")
    import shlex

    try:
        engine_args = parse_engine_args(ctx.args) if ctx.args else NO_ENGINE_ARGS
        if engine_args_text:
            # The environment's (a deploy file's pool arguments) yield to the command line: its engine arguments
            # and the worker's own options given there.
            given_here = {name for name in SHARED_ARGS
                          # By name: typer's context may be its own click's, with its own ParameterSource enum.
                          if getattr(ctx.get_parameter_source(name), "name", "") == "COMMANDLINE"}
            from_env = parse_engine_args(shlex.split(engine_args_text))
            engine_args = EngineArgs(given={**from_env.without(tuple(given_here)), **engine_args.given},
                                     argv=(*from_env.argv, *engine_args.argv))
    except (EngineArgsError, ValueError) as exc:  # ValueError: shlex on an unbalanced quote
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    # vLLM arguments that are also the worker's own options replace them (both engines, the router's block hashes
    # and the frontend's context see one value).
    block_size = engine_args.get("block_size", block_size)
    num_blocks = engine_args.get("num_gpu_blocks_override", num_blocks)
    max_num_seqs = engine_args.get("max_num_seqs", max_num_seqs)
    max_num_batched_tokens = engine_args.get("max_num_batched_tokens", max_num_batched_tokens)
    dtype = engine_args.get("dtype", dtype)
    max_model_len: Optional[int] = engine_args.get("max_model_len")
    names = tuple(engine_args.get("served_model_name") or ()) or None
    if role not in ("prefill", "decode", "both"):
        raise typer.BadParameter(f"role must be prefill, decode or both, not {role!r}")
    kv_transfer_checked(kv_transfer)
    loras = lora_modules(lora_modules_given)
    if mock_nixl and kv_transfer != "pull":
        raise typer.BadParameter("--mock-nixl moves KV by READ (pull) only", param_hint="--kv-transfer")
    kv_bytes_per_token = mock_kv_bytes_per_token(mock_block_bytes, block_size)
    from common.addresses import (
        advertise_host,
        check_bind_advertise,
        check_push_side_channel,
        is_loopback,
        nixl_advertise_host,
    )

    address_checked(check_bind_advertise, endpoint, advertise_endpoint or "", "--endpoint", "--advertise")
    nixl_peer_host = address_checked(nixl_advertise_host, nixl_host, nixl_advertise, advertise_endpoint or "")
    if engine == "vllm":
        # A switchable worker may decode later, whatever its role now: in push its side channel is dialed then.
        address_checked(check_push_side_channel, nixl_host, kv_transfer, "both" if switchable else role)
    if (engine == "vllm" and role != "decode" and is_loopback(nixl_peer_host) and advertise_endpoint
            and not is_loopback(address_checked(advertise_host, advertise_endpoint))):
        typer.echo(f"warning: --advertise {advertise_endpoint} but decode engines are told to pull KV from "
                   f"{nixl_peer_host}: set --nixl-host 0.0.0.0 (or --nixl-advertise) for decode on other hosts",
                   err=True)
    ref = resolved_model(model, engine_args.get("revision", "main"))
    model_dir = ref.path
    info = validated(model_dir, need_weights=engine != "mock")  # the mock engine reads config.json only
    name = (names or served_names(served_model_name, ref.name))[0]  # the frontend owns aliases
    # Block hashes are seeded by what the model is (config, tokenizer, weight files' names and sizes), not by a
    # directory's or a served name: two models both in ".../model" differ, one model at two paths agrees.
    seed = hash_seed(model_identity(model_dir))
    node = node or default_node()
    # PIDs repeat across machines (every container's first process is 1): the node keeps default ids apart.
    wid = worker_id or f"{role}-{node}-{os.getpid()}"
    own_transport = transport(curve_dir, "worker")  # bad keys: a one-line error now
    # The mock engine serves any request whatever its role; a vLLM engine only with kv_both (opt-in: kv_both
    # costs a decode engine its progress-thread-free NIXL agent and its small batch budget).
    switchable = (engine == "mock") if switchable is None else switchable
    if engine == "mock":
        from common.timing import TimingModel
        from services.worker.engines.mock.config import MockEngineConfig
        from services.worker.engines.mock.engine import MockEngine

        if mock_profile is not None:
            from common.profile import load_timing

            try:
                timing = load_timing(mock_profile, mock_speedup)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                typer.echo(f"error: --mock-profile {mock_profile}: {exc}", err=True)
                raise typer.Exit(2) from exc
        else:
            timing = TimingModel(speedup=mock_speedup)
        ignored = sorted(set(engine_args.given) - set(SHARED_ARGS) - {"revision"})
        if ignored:
            typer.echo(f"warning: the mock engine ignores vLLM engine arguments {', '.join(ignored)}", err=True)
        eng = MockEngine(MockEngineConfig(
            num_blocks=num_blocks or 2048, block_size=block_size, max_num_seqs=max_num_seqs or 64,
            max_num_batched_tokens=max_num_batched_tokens or 2048,
            # A sequence cannot outgrow the KV pool: register that as the served context, as vLLM does.
            max_model_len=min(max_model_len or info.max_position_embeddings, (num_blocks or 2048) * block_size),
            vocab_size=info.vocab_size, eos_token_id=info.eos_token_ids[0] if info.eos_token_ids else 0,
            other_eos_token_ids=tuple(info.eos_token_ids[1:]),
            hash_seed=seed, timing=timing, engine_id=wid,
            tier=_tier_client(kvtier, wid, own_transport.curve, model_id=seed),
            tier_write_through=bool(kvtier_write_through), start_s=mock_start_s, kv_transfer=kv_transfer,
            kv_bytes_per_token=kv_bytes_per_token, nixl=mock_nixl, nixl_hold_s=mock_nixl_hold_s,
            lora_names=tuple(name for name, _ in loras)))
    elif engine == "vllm":
        from services.worker.engines.vllm.config import VllmEngineConfig, engine_process_env
        from services.worker.engines.vllm.engine import VllmEngine

        if max_model_len is None and num_blocks is not None:
            max_model_len = min(info.max_position_embeddings, (num_blocks - 1) * block_size)  # vLLM keeps 1 null block
        if max_num_batched_tokens is not None and "max_num_batched_tokens" not in engine_args.given:
            # The worker's own option: a decode worker may take a small per-step budget (its local prefills are
            # then chunked); the others keep room for a whole long prompt in one step. vLLM's name after `--` is
            # taken as given.
            max_num_batched_tokens = (max(max_num_batched_tokens, max_num_seqs or 64)
                                      if role == "decode" and not switchable else max(max_num_batched_tokens, 2048))
        config = VllmEngineConfig(
            model=model_dir, dtype=dtype, block_size=block_size, num_blocks=num_blocks, max_model_len=max_model_len,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            engine_args=engine_args.without((*SHARED_ARGS, "revision")),
            kv_role="both" if switchable else role, switchable=switchable, kv_transfer=kv_transfer,
            nixl_side_channel_port=nixl_port,
            nixl_side_channel_host=nixl_host, nixl_advertise_host=nixl_peer_host,
            kv_cache_space_gib=kv_cache_gib, engine_id=wid, hash_seed=seed, lora_modules=loras,
            kvtier_endpoint=kvtier, kvtier_write_through=kvtier_write_through is not False,
            # Loaded (checked) above; vLLM's processes load them again from this path (no key material in argv).
            kvtier_curve_dir=str(curve_key_dir(curve_dir, "worker") or ""))
        engine_env = engine_process_env(config, None)
        if gpus is not None or _on_cuda(None):
            core = None  # a GPU engine's threads are vLLM's to place (one core would starve its TP workers)
            engine_env = {**engine_process_env(config, None), **_gpu_env(gpus, engine_args.given)}
        if core is not None and core not in os.sched_getaffinity(0):
            # A container's cpuset may not hold it: vLLM would fail binding its threads to it.
            typer.echo(f"warning: --core {core} is not one of this process's cores "
                       f"{sorted(os.sched_getaffinity(0))}: not pinned", err=True)
            core = None
        if core is not None:
            # The whole process tree (vLLM's engine core and model processes are our children) stays on its
            # core: OpenMP binding alone leaves their busy-wait and NIXL threads free to land on a neighbour's.
            os.sched_setaffinity(0, {core})
        reexec_with_engine_env(engine_process_env(config, core) if core is not None else engine_env)
        from cli.engine_reaper import private_socket_dir, start_engine_reaper

        config = dataclasses.replace(config, socket_dir=private_socket_dir(wid))
        # Before vLLM starts its engine processes: they die with us, even by SIGKILL, and their sockets go.
        start_engine_reaper(remove_dirs=(config.socket_dir,))
        from cli.shm_tracker import start_shm_tracker, sweep_stale_records

        sweep_stale_records()  # what a killed worker's tracker held on this host
        start_shm_tracker()  # after the reaper's fork (it must not hold the tracker's pipe): names survive a kill
        eng = VllmEngine(config)
    else:
        raise typer.BadParameter(f"engine must be mock or vllm, not {engine!r}")
    service = WorkerService(WorkerConfig(worker_id=wid, role=role, model=name, router_endpoint=router_endpoint,
                                         endpoint=endpoint, advertise_endpoint=advertise_endpoint or "",
                                         engine_kind=engine, hash_seed=seed,
                                         node=node, zone=zone, switchable=switchable,
                                         transport=own_transport, metrics_port=metrics_port,
                                         metrics_host=metrics_host,
                                         drain_timeout_s=drain_timeout_s), eng)
    from services.worker.service import EngineDied

    try:
        run_service(service.run, on_term=service.drain)
    except EngineDied as exc:
        # Deregistered already; a non-zero exit is what systemd, Kubernetes and `up` restart on.
        typer.echo(f"worker {wid}: {exc}; exiting for a restart", err=True)
        raise typer.Exit(ENGINE_DEAD_EXIT_CODE) from None


def _on_cuda(devices: tuple[int, ...] | None) -> bool:
    from cli.gpus import engine_on_cuda

    return engine_on_cuda(devices, os.environ)


def _gpu_env(gpus: Optional[str], given: dict) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES (--gpus: the engine's tensor x pipeline parallel devices) and NIXL's UCX settings for
    GPU memory (the user's own UCX_* win)."""
    from cli.gpus import devices_option, has_rdma_device, placement_or_exit, pool_demand
    from services.worker.engines.vllm.ucx import gpu_ucx_env

    env: dict[str, str] = {}
    devices: tuple[int, ...] | None = None
    if gpus is not None:
        devices = devices_option(gpus)
        placed = placement_or_exit(devices, [pool_demand("worker", 1, given)]).engines[0]
        env["CUDA_VISIBLE_DEVICES"] = placed.cuda_visible_devices
    ucx = gpu_ucx_env(_on_cuda(devices), os.environ, has_rdma_device())
    if ucx.warning:
        typer.echo(f"warning: {ucx.warning}", err=True)
    return {**env, **ucx.env}


def _tier_client(endpoint: str, worker_id: str, curve=None, model_id: int = 0):
    if not endpoint:
        return None
    from common.kvtier.client import TierClient, TierClientConfig

    return TierClient(TierClientConfig(endpoint=endpoint, worker_id=worker_id, curve=curve,
                                       model_id=model_id))
