"""splitserve's command line: one command per service (for systemd), `up` for a whole local graph.

Only this package reads the environment and configures logging; services get frozen configs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer

from cli.logs import configure_logging
from cli.runner import run_service

DTYPE_HELP = "vLLM: auto (the model's; float32 for a 16-bit model on a CPU without native bf16) | float32 | bfloat16"

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Disaggregated LLM serving.")
model_app = typer.Typer(no_args_is_help=True, help="Model directories.")
app.add_typer(model_app, name="model")

DEFAULT_ROUTER = "tcp://127.0.0.1:5550"
LogLevel = typer.Option("info", "--log-level", envvar="SPLITSERVE_LOG_LEVEL")
LogJson = typer.Option(False, "--log-json", envvar="SPLITSERVE_LOG_JSON", help="JSON log lines")
CurveDir = typer.Option(None, "--curve-dir", envvar="SPLITSERVE_CURVE_DIR",
                        help="CURVE keys (from `splitserve keys make`) for sockets that cross hosts")
keys_app = typer.Typer(no_args_is_help=True, help="ZeroMQ CURVE keys.")
app.add_typer(keys_app, name="keys")
from cli.bench import bench_app  # noqa: E402
app.add_typer(bench_app, name="bench")


def _transport(curve_dir: Optional[Path]):
    from common.security import load_curve_keys
    from common.transport import TransportConfig

    return TransportConfig(curve=load_curve_keys(curve_dir) if curve_dir else None)


@app.command()
def router(
    endpoint: str = typer.Option(DEFAULT_ROUTER, envvar="SPLITSERVE_ROUTER", help="ZeroMQ bind address"),
    policy: str = typer.Option("kv", help="kv | round-robin | random | least-loaded"),
    local_prefill_max_tokens: int = typer.Option(256, help="Uncached prompt tokens at or below which the "
                                                 "decode worker prefills locally"),
    events_endpoint: str = typer.Option("tcp://127.0.0.1:0", help="ZeroMQ SUB bind address for KV events"),
    events_advertise: str = typer.Option("", help="KV-event address workers are told (default: the bound one)"),
    heartbeat_timeout_s: float = typer.Option(5.0, help="Drop a worker silent this long"),
    metrics_port: int = typer.Option(0, help="Prometheus port (0: none)"),
    prefill_weight: Optional[float] = typer.Option(None, help="kv cost: weight of blocks to prefill vs active "
                                                   "decode blocks (default: PolicyConfig's)"),
    busy_threshold: Optional[float] = typer.Option(None, help="kv: skip workers with more of their KV in use "
                                                   "than this fraction (default: PolicyConfig's)"),
    curve_dir: Optional[Path] = CurveDir,
    log_level: str = LogLevel,
    log_json: bool = LogJson,
) -> None:
    """Run the router: registry, prefix index, route decisions."""
    from services.router.policy import PolicyConfig
    from services.router.service import RouterConfig, RouterService

    configure_logging(log_level, log_json, "router")
    config = RouterConfig(endpoint=endpoint, events_endpoint=events_endpoint, events_advertise=events_advertise,
                          heartbeat_timeout_s=heartbeat_timeout_s, metrics_port=metrics_port,
                          transport=_transport(curve_dir),
                          policy=PolicyConfig(policy=policy, local_prefill_max_tokens=local_prefill_max_tokens,
                                              **{k: v for k, v in (("prefill_weight", prefill_weight),
                                                                   ("busy_threshold", busy_threshold))
                                                 if v is not None}))
    run_service(RouterService(config).run)


@app.command()
def worker(
    model: Path = typer.Option(..., help="HF model directory"),
    role: str = typer.Option("both", help="prefill | decode | both"),
    router_endpoint: str = typer.Option(DEFAULT_ROUTER, "--router", envvar="SPLITSERVE_ROUTER"),
    endpoint: str = typer.Option("tcp://127.0.0.1:0", help="ZeroMQ bind address for requests"),
    advertise_endpoint: Optional[str] = typer.Option(
        None, "--advertise", help="Endpoint registered with the router, when peers must dial another address "
        "than --endpoint (e.g. tcp://prefill:5560 for a container bound to 0.0.0.0)"),
    served_model_name: Optional[str] = typer.Option(None, help="Name clients use (default: directory name)"),
    worker_id: Optional[str] = typer.Option(None, help="Default: role-pid"),
    engine: str = typer.Option("mock", help="mock | vllm"),
    block_size: int = typer.Option(32, help="Tokens per KV block (vLLM on CPU needs a multiple of 32)"),
    num_blocks: Optional[int] = typer.Option(None, help="KV blocks (mock default 2048; vLLM: from memory)"),
    max_num_seqs: int = typer.Option(64),
    max_num_batched_tokens: int = typer.Option(2048),
    mock_speedup: float = typer.Option(1.0, help="Mock timing divided by this; inf = no delay"),
    mock_profile: Optional[Path] = typer.Option(None, help="Mock timing fitted from this `splitserve profile` JSON"),
    kvtier: str = typer.Option("", "--kvtier", envvar="SPLITSERVE_KVTIER",
                               help="kvtier endpoint: offload KV blocks there and onboard prefixes from it "
                               "(vLLM: through our KV connector, services/worker/vllm_tier_connector.py)"),
    kvtier_write_through: Optional[bool] = typer.Option(
        None, help="Offload blocks right after prefill (default: mock no, on eviction only; vLLM yes: its "
        "connector API does not expose evictions, so write-through is its only save path)"),
    dtype: str = typer.Option("auto", help=DTYPE_HELP),
    nixl_port: int = typer.Option(5600, help="vLLM: NIXL side-channel port, distinct per engine"),
    kv_cache_gib: int = typer.Option(1, help="vLLM on CPU: KV cache space"),
    core: Optional[int] = typer.Option(None, help="vLLM on CPU: pin the engine's threads to this core"),
    metrics_port: int = typer.Option(0, help="Prometheus port (0: none)"),
    drain_timeout_s: float = typer.Option(30.0, help="On SIGTERM: finish requests for at most this long, then exit"),
    curve_dir: Optional[Path] = CurveDir,
    log_level: str = LogLevel,
    log_json: bool = LogJson,
) -> None:
    """Run one worker: an engine (mock or vLLM) behind a socket, registered with the router."""
    from common.hashing import hash_seed
    from services.worker.service import WorkerConfig, WorkerService

    configure_logging(log_level, log_json, f"worker-{role}")
    if role not in ("prefill", "decode", "both"):
        raise typer.BadParameter(f"role must be prefill, decode or both, not {role!r}")
    info = _validated(model)
    name = served_model_name or model.resolve().name
    wid = worker_id or f"{role}-{os.getpid()}"
    if engine == "mock":
        from services.worker.mock.engine import MockEngine, MockEngineConfig
        from services.worker.mock.timing import TimingModel

        if mock_profile is not None:
            from services.planner.profile import load_timing

            try:
                timing = load_timing(mock_profile, mock_speedup)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                typer.echo(f"error: --mock-profile {mock_profile}: {exc}", err=True)
                raise typer.Exit(2) from exc
        else:
            timing = TimingModel(speedup=mock_speedup)
        eng = MockEngine(MockEngineConfig(
            num_blocks=num_blocks or 2048, block_size=block_size, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, max_model_len=info.max_position_embeddings,
            vocab_size=info.vocab_size, eos_token_id=info.eos_token_ids[0] if info.eos_token_ids else 0,
            other_eos_token_ids=tuple(info.eos_token_ids[1:]),
            hash_seed=hash_seed(name), timing=timing, engine_id=wid, tier=_tier_client(kvtier, wid),
            tier_write_through=bool(kvtier_write_through)))
    elif engine == "vllm":
        from services.worker.vllm_engine import VllmEngine, VllmEngineConfig, engine_process_env

        config = VllmEngineConfig(
            model=model, dtype=dtype, block_size=block_size, num_blocks=num_blocks, max_model_len=min(
                info.max_position_embeddings, 8192, ((num_blocks or 8192) - 1) * block_size),  # vLLM keeps 1 null block
            max_num_seqs=max_num_seqs,
            # A decode worker may take a small per-step budget (its local prefills are then chunked); the others
            # keep room for a whole long prompt in one step.
            max_num_batched_tokens=(max(max_num_batched_tokens, max_num_seqs) if role == "decode"
                                    else max(max_num_batched_tokens, 2048)), kv_role=role, nixl_side_channel_port=nixl_port,
            kv_cache_space_gib=kv_cache_gib, engine_id=wid, hash_seed=hash_seed(name),
            kvtier_endpoint=kvtier, kvtier_write_through=kvtier_write_through is not False)
        if core is not None and core in os.sched_getaffinity(0):
            # The whole process tree (vLLM's engine core and model processes are our children) stays on its
            # core: OpenMP binding alone leaves their busy-wait and NIXL threads free to land on a neighbour's.
            os.sched_setaffinity(0, {core})
        _reexec_with_engine_env(engine_process_env(config, core))
        eng = VllmEngine(config)
    else:
        raise typer.BadParameter(f"engine must be mock or vllm, not {engine!r}")
    service = WorkerService(WorkerConfig(worker_id=wid, role=role, model=name, router_endpoint=router_endpoint,
                                         endpoint=endpoint, advertise_endpoint=advertise_endpoint or "",
                                         engine_kind=engine, hash_seed=hash_seed(name),
                                         transport=_transport(curve_dir), metrics_port=metrics_port,
                                         drain_timeout_s=drain_timeout_s), eng)
    run_service(service.run, on_term=service.drain)


def _tier_client(endpoint: str, worker_id: str):
    if not endpoint:
        return None
    from services.worker.tier_client import TierClient, TierClientConfig

    return TierClient(TierClientConfig(endpoint=endpoint, worker_id=worker_id))


@app.command()
def kvtier(
    endpoint: str = typer.Option("tcp://127.0.0.1:5570", envvar="SPLITSERVE_KVTIER", help="ZeroMQ bind address"),
    advertise_endpoint: Optional[str] = typer.Option(None, "--advertise", help="Endpoint workers are told"),
    router_endpoint: str = typer.Option(DEFAULT_ROUTER, "--router", envvar="SPLITSERVE_ROUTER",
                                        help="Router to register with and publish KV events to (\"\": standalone)"),
    tier_id: str = typer.Option("kvtier-0", help="Source id of this tier in the router's index"),
    host_cache_gb: float = typer.Option(1.0, help="Host-memory pool, GiB"),
    disk_cache_gb: float = typer.Option(0.0, help="NVMe tier, GiB (0: none)"),
    disk_cache_dir: Optional[Path] = typer.Option(None, help="Directory of the NVMe tier's slab file"),
    block_bytes: int = typer.Option(36864 * 32, help="Slot size: the largest KV block held, bytes (vLLM workers: "
                                    "2 * layers * kv_heads * head_dim * dtype bytes * block_size; `up` sizes it)"),
    disk_min_hits: int = typer.Option(1, help="Hits a host block needs to move to disk on eviction"),
    nixl: bool = typer.Option(True, help="Register the pool with NIXL (UCX + POSIX backends)"),
    disk_nixl: bool = typer.Option(True, help="Disk I/O through NIXL's POSIX backend (else pread/pwrite)"),
    metrics_port: int = typer.Option(0, help="Prometheus port (0: none)"),
    log_level: str = LogLevel,
    log_json: bool = LogJson,
) -> None:
    """Run kvtier: a shared KV-block store (host pool + NVMe) that workers offload to and load from."""
    import tempfile

    from services.kvtier.pool import GIB
    from services.kvtier.service import KvTierConfig, KvTierService

    configure_logging(log_level, log_json, "kvtier")
    disk_dir = disk_cache_dir
    if disk_cache_gb > 0 and disk_dir is None:
        disk_dir = Path(tempfile.gettempdir()) / f"splitserve-kvtier-{os.getpid()}"
    config = KvTierConfig(tier_id=tier_id, endpoint=endpoint, advertise_endpoint=advertise_endpoint or "",
                          router_endpoint=router_endpoint, host_bytes=int(host_cache_gb * GIB),
                          disk_bytes=int(disk_cache_gb * GIB), disk_dir=disk_dir, block_bytes=block_bytes,
                          disk_min_hits=disk_min_hits, nixl=nixl, disk_nixl=disk_nixl, metrics_port=metrics_port)
    run_service(KvTierService(config).run)


def _validated(model: Path):
    """The model directory's facts, or a one-line error and exit code 2 (never a traceback)."""
    from common.errors import ModelError
    from common.tiny_model import validate_model_dir

    try:
        return validate_model_dir(model)
    except ModelError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


def _reexec_with_engine_env(env: dict[str, str]) -> None:
    """LD_PRELOAD only takes effect at process start: re-exec once with the engine's environment."""
    missing = {k: v for k, v in env.items() if os.environ.get(k) != v}
    if not missing:
        return
    if os.environ.get("SPLITSERVE_REEXECED"):
        os.environ.update(missing)  # already re-executed once; set what can still be set in-process
        return
    # orig_argv repeats this very invocation, whether `python -m cli.main worker` or a console script.
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**os.environ, **env, "SPLITSERVE_REEXECED": "1"})


@app.command()
def frontend(
    model: Path = typer.Option(..., help="HF model directory (tokenizer, chat template)"),
    served_model_name: Optional[str] = typer.Option(None),
    router_endpoint: str = typer.Option(DEFAULT_ROUTER, "--router", envvar="SPLITSERVE_ROUTER"),
    host: str = typer.Option("127.0.0.1", envvar="SPLITSERVE_HOST"),
    port: int = typer.Option(8000, envvar="SPLITSERVE_PORT"),
    max_body_mib: float = typer.Option(8.0, help="Largest request body accepted"),
    migration_limit: int = typer.Option(3, help="Times a request may move after losing its worker"),
    api_key: str = typer.Option("", envvar="SPLITSERVE_API_KEY", help="Require this Bearer key on /v1/*"),
    max_inflight: int = typer.Option(4096, envvar="SPLITSERVE_MAX_INFLIGHT",
                                     help="Requests in flight before new ones get 503"),
    curve_dir: Optional[Path] = CurveDir,
    log_level: str = LogLevel,
    log_json: bool = LogJson,
) -> None:
    """Run the OpenAI-compatible HTTP frontend."""
    from services.frontend.http import HttpConfig
    from services.frontend.pipeline import PipelineConfig
    from services.frontend.service import FrontendConfig, FrontendService

    configure_logging(log_level, log_json, "frontend")
    _validated(model)
    config = FrontendConfig(
        model_name=served_model_name or model.resolve().name, model_dir=model,
        pipeline=PipelineConfig(router_endpoint=router_endpoint, migration_limit=migration_limit,
                                transport=_transport(curve_dir)),
        http=HttpConfig(host=host, port=port, max_body_bytes=int(max_body_mib * 1024 * 1024)),
        api_key=api_key, max_inflight_requests=max_inflight)
    run_service(FrontendService(config).run)


@app.command()
def up(
    model: Optional[Path] = typer.Option(None, help="HF model directory (default: the embedded tiny model)"),
    engine: str = typer.Option("vllm", help="mock | vllm"),
    prefill: int = typer.Option(1, help="Prefill workers"),
    decode: int = typer.Option(1, help="Decode workers"),
    aggregated: int = typer.Option(0, help="Workers with role both (replaces the P/D pools when > 0)"),
    router_policy: str = typer.Option("kv"),
    local_prefill_max_tokens: int = typer.Option(256),
    block_size: int = typer.Option(32, help="Tokens per KV block (vLLM on CPU needs a multiple of 32)"),
    num_blocks: Optional[int] = typer.Option(None),
    mock_speedup: float = typer.Option(1.0),
    mock_profile: Optional[Path] = typer.Option(None, help="Mock workers' timing from this profile JSON"),
    no_kvtier: bool = typer.Option(False, "--no-kvtier", help="Run without the shared KV tier"),
    host_cache_gb: float = typer.Option(1.0, help="kvtier host-memory pool, GiB"),
    disk_cache_gb: float = typer.Option(0.0, help="kvtier NVMe tier, GiB (0: none)"),
    disk_cache_dir: Optional[Path] = typer.Option(None, help="kvtier NVMe directory (default: a temp dir)"),
    kvtier_metrics_port: int = typer.Option(0, help="kvtier Prometheus port (0: none)"),
    dtype: str = typer.Option("auto", help=DTYPE_HELP),
    host: str = typer.Option("127.0.0.1", envvar="SPLITSERVE_HOST"),
    port: int = typer.Option(8000, envvar="SPLITSERVE_PORT"),
    router_port: int = typer.Option(0, help="Router's ZeroMQ port (0: any free one)"),
    router_metrics_port: int = typer.Option(0, help="Router's Prometheus port (0: none)"),
    router_prefill_weight: Optional[float] = typer.Option(None, help="Router's kv prefill weight (default: its own)"),
    router_busy_threshold: Optional[float] = typer.Option(None, help="Router's busy threshold (default: its own)"),
    decode_max_batched_tokens: int = typer.Option(
        0, help="Tokens a decode worker computes per step (0: default); small values spread local prefills"),
    pin_control_plane: bool = typer.Option(
        True, help="vLLM: keep frontend, router, kvtier and planner off decode cores (free cores, else prefill's)"),
    planner: bool = typer.Option(False, "--planner", help="Scale the prefill and decode pools live"),
    planner_slo: str = typer.Option("ttft_ms=1000,itl_ms=100", help="The planner's SLOs (p90)"),
    planner_profile: Optional[Path] = typer.Option(None, help="`splitserve profile` JSON: scale ahead of the SLO"),
    planner_interval_s: float = typer.Option(5.0, help="Seconds between planner decisions"),
    planner_window_s: float = typer.Option(30.0, help="Seconds of metrics each planner decision reads"),
    max_prefill: int = typer.Option(4, help="Planner: most prefill workers"),
    max_decode: int = typer.Option(4, help="Planner: most decode workers"),
    max_workers: int = typer.Option(0, help="Planner: most workers in all (0: vLLM one per core; mock max-prefill + max-decode)"),
    planner_decisions: Optional[Path] = typer.Option(None, help="Planner: append each interval's decision (JSON lines)"),
    log_level: str = LogLevel,
    log_json: bool = LogJson,
) -> None:
    """Launch a whole local graph (router, workers, frontend) and stop it cleanly on Ctrl-C."""
    from cli.launcher import GraphSpec, PlannerSpec, launch

    configure_logging(log_level, log_json, "up")
    spec = GraphSpec(model=model, engine=engine, num_prefill=0 if aggregated else prefill,
                     num_decode=0 if aggregated else decode, num_aggregated=aggregated, router_policy=router_policy,
                     local_prefill_max_tokens=local_prefill_max_tokens, block_size=block_size, num_blocks=num_blocks,
                     mock_speedup=mock_speedup, mock_profile=mock_profile, kvtier=not no_kvtier,
                     host_cache_gb=host_cache_gb, disk_cache_gb=disk_cache_gb, disk_cache_dir=disk_cache_dir,
                     kvtier_metrics_port=kvtier_metrics_port, dtype=dtype, host=host, port=port, router_port=router_port,
                     router_metrics_port=router_metrics_port, router_prefill_weight=router_prefill_weight,
                     router_busy_threshold=router_busy_threshold, log_level=log_level,
                     log_json=log_json, decode_max_batched_tokens=decode_max_batched_tokens,
                     pin_control_plane=pin_control_plane,
                     planner=PlannerSpec(slo=planner_slo, profile=planner_profile, interval_s=planner_interval_s,
                                         window_s=planner_window_s,
                                         max_prefill=max_prefill, max_decode=max_decode,
                                         max_workers=max_workers or ((os.cpu_count() or 1) if engine == "vllm"
                                                                   else max_prefill + max_decode),
                                         decisions_path=planner_decisions) if planner else None)
    raise typer.Exit(launch(spec))


@app.command("planner")
def planner_cmd(
    router_endpoint: str = typer.Option(DEFAULT_ROUTER, "--router", envvar="SPLITSERVE_ROUTER"),
    metrics_url: list[str] = typer.Option(["http://127.0.0.1:8000/metrics"], help="Frontend /metrics (repeatable)"),
    events: str = typer.Option("tcp://127.0.0.1:5590", help="PUB socket for ScaleRequests (orchestrators subscribe)"),
    slo: str = typer.Option("ttft_ms=1000,itl_ms=100", help="p90 targets: ttft_ms=..,itl_ms=.."),
    profile_path: Optional[Path] = typer.Option(None, "--profile", help="`splitserve profile` JSON (model-based targets)"),
    interval_s: float = typer.Option(5.0, help="Seconds between decisions"),
    window_s: float = typer.Option(30.0, help="Each decision reads this many seconds of metrics"),
    min_prefill: int = typer.Option(1),
    max_prefill: int = typer.Option(4),
    min_decode: int = typer.Option(1),
    max_decode: int = typer.Option(4),
    max_workers: int = typer.Option(8, help="Most prefill + decode workers"),
    down_after_intervals: int = typer.Option(3, help="Quiet intervals in a row before a worker is drained"),
    decisions: Optional[Path] = typer.Option(None, help="Append each interval's observation and decision (JSON lines)"),
    curve_dir: Optional[Path] = CurveDir,
    log_level: str = LogLevel,
    log_json: bool = LogJson,
) -> None:
    """Watch the graph's latency, queues and KV usage; publish how many prefill and decode workers it needs."""
    from services.planner.plan import Slo
    from services.planner.policy import PlannerConfig
    from services.planner.service import PlannerService, PlannerServiceConfig

    configure_logging(log_level, log_json, "planner")
    try:
        slo_parsed = Slo.parse(slo)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    timing, options = None, None
    if profile_path is not None:
        from services.planner.plan import options_from_profile
        from services.planner.profile import load_profile, timing_fields
        from services.worker.mock.timing import TimingModel

        try:
            doc = load_profile(profile_path)
            timing, options = TimingModel.from_profile(timing_fields(doc)), options_from_profile(doc)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            typer.echo(f"error: --profile {profile_path}: {exc}", err=True)
            raise typer.Exit(2) from exc
    policy = PlannerConfig(slo=slo_parsed, min_prefill=min_prefill, max_prefill=max_prefill, min_decode=min_decode,
                           max_decode=max_decode, max_workers=max_workers, down_after_intervals=down_after_intervals)
    config = PlannerServiceConfig(router_endpoint=router_endpoint, metrics_urls=tuple(metrics_url), policy=policy,
                                  events_endpoint=events, interval_s=interval_s, window_s=window_s, timing=timing,
                                  decisions_path=decisions, transport=_transport(curve_dir),
                                  **({"plan_options": options} if options is not None else {}))
    run_service(PlannerService(config).run)


@app.command("planner-events")
def planner_events(
    events: str = typer.Option("tcp://127.0.0.1:5590", help="The planner's PUB socket"),
    count: int = typer.Option(0, help="Exit after this many (0: never)"),
) -> None:
    """Print the planner's ScaleRequests as JSON lines, for an orchestrator script (systemd, kubectl)."""
    import json

    import zmq

    from common.errors import ProtocolError
    from common.protocol import ScaleRequest, decode

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(events)
    try:
        seen = 0
        while count == 0 or seen < count:
            try:
                msg = decode(sub.recv())
            except ProtocolError as exc:
                typer.echo(f"dropped: {exc}", err=True)
                continue
            if isinstance(msg, ScaleRequest):
                typer.echo(json.dumps({"pool": msg.pool, "current": msg.current, "target": msg.target,
                                       "reason": msg.reason, "seq": msg.seq, "time_s": msg.time_s}))
                seen += 1
    except KeyboardInterrupt:
        pass
    finally:
        sub.close()
        ctx.term()


@keys_app.command("make")
def keys_make(out: Path = typer.Option(Path("keys"), help="Output directory")) -> None:
    """Write a server keypair and a client keypair; give the directory to every service (--curve-dir)."""
    from common.security import make_curve_keys

    typer.echo(str(make_curve_keys(out)))


@app.command()
def profile(
    engine: str = typer.Option("vllm", help="mock | vllm"),
    model: Path = typer.Option(Path("models/tiny"), help="HF model directory (vllm; made if models/tiny is missing)"),
    output: Path = typer.Option(Path("bench/results/profile.json"), help="Profile JSON to write"),
    quick: bool = typer.Option(False, help="Fewer points, ~2 minutes budget (tests, smoke checks)"),
    max_seconds: Optional[float] = typer.Option(None, help="Soft time budget (default 600, quick 150)"),
    dtype: str = typer.Option("auto", help=DTYPE_HELP),
    block_size: int = typer.Option(32, help="Tokens per KV block"),
    core: Optional[int] = typer.Option(0, help="vLLM on CPU: pin the engine to this core"),
    kv_cache_gib: int = typer.Option(1, help="vLLM on CPU: KV cache space"),
    mock_speedup: float = typer.Option(1.0, help="mock: timing divided by this"),
) -> None:
    """Measure prefill and decode step times of one engine; write JSON with conditions and a fitted timing."""
    import asyncio
    import dataclasses

    from services.planner import profile as prof

    spec = prof.QUICK if quick else prof.ProfileSpec()
    if max_seconds is not None:
        spec = dataclasses.replace(spec, max_seconds=max_seconds)
    say = lambda msg: typer.echo(msg, err=True)  # noqa: E731
    if engine == "mock":
        from services.worker.mock.timing import TimingModel

        doc = asyncio.run(prof.profile_mock(spec, TimingModel(speedup=mock_speedup), block_size, log=say))
    elif engine == "vllm":
        from services.worker.vllm_engine import engine_process_env

        if model == Path("models/tiny") and not (model / "config.json").exists():
            from common.tiny_model import make_tiny_model

            make_tiny_model(model)
        _validated(model)
        config = prof.vllm_config_for(model, spec, dtype, block_size, kv_cache_gib)
        _reexec_with_engine_env({**engine_process_env(config, core), "VLLM_LOGGING_LEVEL": "WARNING"})
        doc = asyncio.run(prof.profile_vllm(config, spec, log=say))
    else:
        raise typer.BadParameter(f"engine must be mock or vllm, not {engine!r}")
    prof.write_profile(doc, output)
    fit = doc["fit"]
    typer.echo(f"wrote {output} ({doc['conditions']['elapsed_s']:.0f} s, fit max error prefill "
               f"{fit['prefill_max_rel_err']:.1%}, decode {fit['decode_max_rel_err']:.1%})")


@app.command()
def plan(
    profile_path: Path = typer.Option(..., "--profile", help="`splitserve profile` JSON"),
    isl: str = typer.Option(..., help="Input tokens: a mean, or samples 128,512,2048 (a distribution)"),
    osl: str = typer.Option(..., help="Output tokens: a mean, or samples"),
    rate: Optional[float] = typer.Option(None, help="Requests/s (open loop)"),
    concurrency: Optional[int] = typer.Option(None, help="Clients (closed loop), instead of --rate"),
    slo: str = typer.Option(..., help="ttft_ms=..,itl_ms=.."),
    max_batch: Optional[int] = typer.Option(None, help="Decode sequences per worker (default: profile's largest)"),
    chunk_tokens: Optional[int] = typer.Option(None, help="Prefill chunk of an aggregated worker (default 2048)"),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON"),
) -> None:
    """Recommend prefill/decode workers and a local-prefill threshold for a workload and SLOs."""
    import json

    from services.planner import plan as planner
    from services.planner.profile import load_profile, timing_fields
    from services.worker.mock.timing import TimingModel

    try:
        doc = load_profile(profile_path)
        timing = TimingModel.from_profile(timing_fields(doc))
        workload = planner.Workload.of([int(x) for x in isl.split(",")], [int(x) for x in osl.split(",")],
                                       rate=rate, concurrency=concurrency)
        result = planner.plan(timing, workload, planner.Slo.parse(slo), planner.options_from_profile(
            doc, max_batch=max_batch, chunk_tokens=chunk_tokens))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(json.dumps(result.to_dict(), indent=2) if as_json else planner.format_plan(result))


@model_app.command("make-tiny")
def make_tiny(
    out: Path = typer.Option(Path("models/tiny"), help="Output directory"),
    size: str = typer.Option("tiny", help="tiny (6.6M params) | 100m"),
    seed: int = typer.Option(0),
) -> None:
    """Write a deterministic HF-format Llama directory (random weights, locally trained tokenizer)."""
    from common.tiny_model import make_tiny_model

    path = make_tiny_model(out, size=size, seed=seed)  # type: ignore[arg-type]
    typer.echo(str(path))


def frontend_main() -> None:
    typer.run(frontend)


def router_main() -> None:
    typer.run(router)


def worker_main() -> None:
    typer.run(worker)


if __name__ == "__main__":
    app()
