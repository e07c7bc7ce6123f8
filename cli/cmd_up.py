"""`splitserve up`: a whole local graph (router, workers, kvtier, frontend, planner) as child processes.

`up --help` groups the options in panels, one per part of the graph an operator tunes.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Optional

import typer

from cli.http_limits import (
    BodyTimeoutS,
    HeaderTimeoutS,
    HttpLimits,
    KeepaliveTimeoutS,
    MaxBodyMib,
    MaxConnections,
    MaxHeaderKib,
)
from cli.admission_options import (
    DefaultTtftBudgetS,
    MaxQueued,
    MaxQueueWaitS,
    ReservedInflight,
    ReservedMaxPriority,
    TenantWeights,
    TtftBudgets,
    admission_args,
)
from cli.cpu_sched import CPU_SCHED_CHOICES
from cli.graph_spec import up_kv_transfer
from cli.logs import configure_logging
from cli.options import (
    DTYPE_HELP,
    ChatTemplate,
    CurveDir,
    EnableAutoToolChoice,
    FirstToken,
    ReasoningParser,
    ToolCallParser,
    frontend_args,
    LogJson,
    LogLevel,
    LORA_MODULES_HELP,
    SERVED_NAME_HELP,
    kv_transfer_checked,
    lora_modules as parse_lora_modules,
    mock_kv_bytes_per_token,
    kv_transfer_option,
    resolved_model,
    served_names,
    validated,
)
from cli.tracing_setup import OtlpTracesEndpoint
from services.planner import defaults as planner_defaults
from services.router.defaults import LOCAL_PREFILL_MAX_STALL_S, LOCAL_PREFILL_MAX_TOKENS

ENGINE = "Engine and model"
POOLS = "Pools"
ROUTING = "Routing"
KVTIER = "KV tier"
PLANNER = "Planner"
NETWORK = "Network"
FRONTEND = "Frontend HTTP"
LOGGING = "Logging and metrics"
PANELS = (ENGINE, POOLS, ROUTING, KVTIER, PLANNER, NETWORK, FRONTEND, LOGGING)


def _in_panel(option, panel: str):
    """A shared option (cli/options.py) shown in one of `up`'s panels, leaving the other commands' copy alone."""
    option = copy.copy(option)
    option.rich_help_panel = panel
    return option


def up(
    ctx: typer.Context,
    # Engine and model
    model: Optional[list[str]] = typer.Option(
        None, help="HF model directory or a Hugging Face id in the local cache (default: the embedded tiny model); "
        "mock needs only config.json and a tokenizer, vLLM also the *.safetensors weights. Repeat it to serve "
        "several models behind one frontend, each with pools of the sizes below (docs/fleet.md)",
        rich_help_panel=ENGINE),
    served_model_name: Optional[list[str]] = typer.Option(
        None, help=SERVED_NAME_HELP + "; with several --model, once per model, in order", rich_help_panel=ENGINE),
    lora_modules: Optional[list[str]] = typer.Option(None, "--lora-modules", help=LORA_MODULES_HELP + " (the "
                                                     "first model's workers)", rich_help_panel=ENGINE),
    prefill_args: str = typer.Option(
        "", help="vLLM engine arguments for prefill engines only, after the common ones: e.g. "
        "'--max-num-batched-tokens 16384 --enable-chunked-prefill'", rich_help_panel=ENGINE),
    decode_args: str = typer.Option(
        "", help="vLLM engine arguments for decode engines only, e.g. '--max-num-seqs 256'", rich_help_panel=ENGINE),
    engine: str = typer.Option("vllm", help="mock | vllm", rich_help_panel=ENGINE),
    dtype: str = typer.Option("auto", help=DTYPE_HELP, rich_help_panel=ENGINE),
    kv_transfer: Optional[str] = _in_panel(kv_transfer_option(None, "pull"), ENGINE),
    block_size: int = typer.Option(32, help="Tokens per KV block (vLLM on CPU needs a multiple of 32)",
                                   rich_help_panel=ENGINE),
    num_blocks: Optional[int] = typer.Option(None, rich_help_panel=ENGINE),
    decode_max_batched_tokens: int = typer.Option(
        0, help="Tokens a decode worker computes per step (0: default); small values spread local prefills",
        rich_help_panel=ENGINE),
    mock_speedup: float = typer.Option(1.0, rich_help_panel=ENGINE),
    mock_start_s: float = typer.Option(0.0, help="Mock: seconds each engine takes to start (a profile's "
                                       "engine_start_s, to compare scaling with switching)", rich_help_panel=ENGINE),
    mock_profile: Optional[Path] = typer.Option(None, help="Mock workers' timing from this profile JSON",
                                                rich_help_panel=ENGINE),
    mock_nixl: bool = typer.Option(False, help="Mock: workers move real bytes with NIXL (pull; else simulated)",
                                   rich_help_panel=ENGINE),
    mock_block_bytes: Optional[int] = typer.Option(None, help="Mock: KV bytes of one block (a multiple of "
                                                   "--block-size)", rich_help_panel=ENGINE),
    # Pools
    gpus: Optional[str] = typer.Option(None, help="vLLM: GPUs for the engines, 0-7 | 0,1,3 | all; each engine gets "
                                       "its tensor x pipeline parallel devices, engines that share one split its "
                                       "memory (docs/gpus.md)", rich_help_panel=POOLS),
    prefill: int = typer.Option(1, help="Prefill workers", rich_help_panel=POOLS),
    decode: int = typer.Option(1, help="Decode workers", rich_help_panel=POOLS),
    aggregated: int = typer.Option(0, help="Workers with role both (replaces the P/D pools when > 0)",
                                   rich_help_panel=POOLS),
    switchable: Optional[bool] = typer.Option(
        None, "--switchable/--fixed-role", help="Workers may move between the prefill and decode pools in place "
        "(`splitserve router set-role`; vLLM engines then run kv_both). Default: mock yes, vLLM no",
        rich_help_panel=POOLS),
    pin_control_plane: bool = typer.Option(
        True, help="vLLM: keep frontend, router, kvtier and planner off decode cores (free cores, else prefill's)",
        rich_help_panel=POOLS),
    cpu_sched: str = typer.Option(
        "auto", help="Processes run under SCHED_BATCH (no wake-up preemption: more requests a core, a wake-up may "
        "wait for the tick): auto (those sharing no core with a vLLM engine), batch (all but vLLM workers), normal",
        rich_help_panel=POOLS),
    # Routing
    router_policy: str = typer.Option("kv", rich_help_panel=ROUTING),
    routers: int = typer.Option(1, min=1, help="Router replicas (each fed by every worker; frontends use any live one)",
                                rich_help_panel=ROUTING),
    router_in_frontend: bool = typer.Option(False, help="Each frontend hosts a router replica in its own process and "
                                            "routes without a message (no router process; --routers ignored)",
                                            rich_help_panel=ROUTING),
    local_prefill_max_tokens: int = typer.Option(LOCAL_PREFILL_MAX_TOKENS, rich_help_panel=ROUTING),
    local_prefill_max_stall_ms: float = typer.Option(LOCAL_PREFILL_MAX_STALL_S * 1e3, help="A streaming decode "
                                                     "worker prefills locally only within this stall",
                                                     rich_help_panel=ROUTING),
    router_prefill_weight: Optional[float] = typer.Option(None, help="Router's kv prefill weight (default: its own)",
                                                          rich_help_panel=ROUTING),
    router_link_min_samples: Optional[int] = typer.Option(None, help="Router's --link-min-samples (default: "
                                                          "its own)", rich_help_panel=ROUTING),
    router_busy_threshold: Optional[float] = typer.Option(None, help="Router's busy threshold (default: its own)",
                                                          rich_help_panel=ROUTING),
    router_idle_decode_prefills: bool = typer.Option(True, help="A decode worker without streams prefills a prompt "
                                                     "itself when it would finish before the busy prefill pool",
                                                     rich_help_panel=ROUTING),
    # KV tier
    no_kvtier: bool = typer.Option(False, "--no-kvtier", help="Run without the shared KV tier",
                                   rich_help_panel=KVTIER),
    host_cache_gb: float = typer.Option(1.0, help="kvtier host-memory pool, GiB", rich_help_panel=KVTIER),
    disk_cache_gb: float = typer.Option(0.0, help="kvtier NVMe tier, GiB (0: none)", rich_help_panel=KVTIER),
    disk_cache_dir: Optional[Path] = typer.Option(None, help="kvtier NVMe directory (default: a temp dir)",
                                                  rich_help_panel=KVTIER),
    # Planner
    planner: bool = typer.Option(False, "--planner", help="Scale the prefill and decode pools live",
                                 rich_help_panel=PLANNER),
    planner_slo: str = typer.Option(planner_defaults.SLO, help="The planner's SLOs (p90)",
                                    rich_help_panel=PLANNER),
    planner_profile: Optional[Path] = typer.Option(None, help="`splitserve profile` JSON: scale ahead of the SLO",
                                                   rich_help_panel=PLANNER),
    planner_interval_s: float = typer.Option(planner_defaults.INTERVAL_S, help="Seconds between planner decisions", rich_help_panel=PLANNER),
    planner_window_s: float = typer.Option(planner_defaults.WINDOW_S, help="Seconds of metrics each planner decision reads",
                                           rich_help_panel=PLANNER),
    max_prefill: int = typer.Option(planner_defaults.MAX_PREFILL, help="Planner: most prefill workers", rich_help_panel=PLANNER),
    max_decode: int = typer.Option(planner_defaults.MAX_DECODE, help="Planner: most decode workers", rich_help_panel=PLANNER),
    max_workers: int = typer.Option(
        0, help="Planner: most workers in all (0: vLLM one per core; mock max-prefill + max-decode)",
        rich_help_panel=PLANNER),
    planner_decisions: Optional[Path] = typer.Option(
        None, help="Planner: append each interval's decision (JSON lines)", rich_help_panel=PLANNER),
    role_switch: bool = typer.Option(False, "--role-switch/--no-role-switch",
                                     help="Planner: move workers between pools in place before starting or "
                                     "draining any",
                                     rich_help_panel=PLANNER),
    planner_min_dwell_s: float = typer.Option(30.0, help="Planner --role-switch: seconds a worker stays in a pool "
                                              "before it moves again", rich_help_panel=PLANNER),
    # Network
    host: str = typer.Option("127.0.0.1", envvar="SPLITSERVE_HOST", help="Frontend's HTTP bind address",
                             rich_help_panel=NETWORK),
    port: int = typer.Option(8000, envvar="SPLITSERVE_PORT", help="Frontend's HTTP port (also its /metrics)",
                             rich_help_panel=NETWORK),
    router_port: int = typer.Option(0, help="Router's ZeroMQ port (0: any free one)", rich_help_panel=NETWORK),
    # Frontend HTTP
    frontends: int = typer.Option(
        0, min=0, help="Frontend processes sharing --port (SO_REUSEPORT); 0: as many as fit the free cores (those "
        "not taken by an engine, a router or the kvtier), at least 1", rich_help_panel=FRONTEND),
    max_body_mib: float = _in_panel(MaxBodyMib, FRONTEND),
    max_header_kib: float = _in_panel(MaxHeaderKib, FRONTEND),
    header_timeout_s: float = _in_panel(HeaderTimeoutS, FRONTEND),
    body_timeout_s: float = _in_panel(BodyTimeoutS, FRONTEND),
    keepalive_timeout_s: float = _in_panel(KeepaliveTimeoutS, FRONTEND),
    max_connections: int = _in_panel(MaxConnections, FRONTEND),
    chat_template: Optional[Path] = _in_panel(ChatTemplate, FRONTEND),
    tool_call_parser: Optional[str] = _in_panel(ToolCallParser, FRONTEND),
    reasoning_parser: Optional[str] = _in_panel(ReasoningParser, FRONTEND),
    enable_auto_tool_choice: bool = _in_panel(EnableAutoToolChoice, FRONTEND),
    first_token: str = _in_panel(FirstToken, FRONTEND),
    max_inflight: int = typer.Option(4096, help="Each frontend's requests in flight before new ones queue "
                                     "(--max-queued) or get 503", rich_help_panel=FRONTEND),
    max_queued: int = _in_panel(MaxQueued, FRONTEND),
    max_queue_wait_s: float = _in_panel(MaxQueueWaitS, FRONTEND),
    ttft_budgets: str = _in_panel(TtftBudgets, FRONTEND),
    default_ttft_budget_s: float = _in_panel(DefaultTtftBudgetS, FRONTEND),
    tenant_weights: str = _in_panel(TenantWeights, FRONTEND),
    reserved_inflight: int = _in_panel(ReservedInflight, FRONTEND),
    reserved_max_priority: int = _in_panel(ReservedMaxPriority, FRONTEND),
    curve: bool = typer.Option(False, "--curve", help="CURVE on every socket with fresh keys per service (`keys "
                               "make` into a private directory of this run, removed at exit)", rich_help_panel=NETWORK),
    curve_dir: Optional[Path] = _in_panel(CurveDir, NETWORK),
    # Logging and metrics
    log_level: str = _in_panel(LogLevel, LOGGING),
    log_json: bool = _in_panel(LogJson, LOGGING),
    otlp_traces_endpoint: str = _in_panel(OtlpTracesEndpoint, LOGGING),
    metrics_sd_file: Optional[Path] = typer.Option(
        None, help="Prometheus file-SD targets, one per service (default: <tmp>/splitserve-<uid>/targets-<port>.json)",
        rich_help_panel=LOGGING),
    router_metrics_port: int = typer.Option(0, help="Router's Prometheus port (0: any free one)",
                                            rich_help_panel=LOGGING),
    kvtier_metrics_port: int = typer.Option(0, help="kvtier's Prometheus port (0: any free one)",
                                            rich_help_panel=LOGGING),
) -> None:
    """Launch a whole local graph (router, workers, frontend) and stop it cleanly on Ctrl-C.

    Every other option is a vLLM engine argument for every engine, under vLLM's name (`up --model M
    --max-model-len 32768 -tp 2`, `--config engine.yaml`); --prefill-args and --decode-args add each pool's own.
    All are checked by vLLM's parser before anything starts."""
    import shlex

    from cli.graph_spec import ExtraModel
    from cli.launcher import GraphSpec, PlannerSpec, frontends_that_fit, launch

    extra_models: list[ExtraModel] = []

    configure_logging(log_level, log_json, "up")
    if engine not in ("mock", "vllm"):
        raise typer.BadParameter(f"engine must be mock or vllm, not {engine!r}", param_hint="--engine")
    if cpu_sched not in CPU_SCHED_CHOICES:
        raise typer.BadParameter(f"one of {', '.join(CPU_SCHED_CHOICES)}, not {cpu_sched!r}", param_hint="--cpu-sched")
    if kv_transfer is not None:
        kv_transfer_checked(kv_transfer)
    if mock_nixl and kv_transfer == "push":
        raise typer.BadParameter("--mock-nixl moves KV by READ (pull) only", param_hint="--kv-transfer")
    kv_transfer = "pull" if mock_nixl else up_kv_transfer(kv_transfer)
    if mock_block_bytes is not None:
        mock_kv_bytes_per_token(mock_block_bytes, block_size)  # a bad value: its one-line error now
    if chat_template is not None and not chat_template.is_file():
        raise typer.BadParameter(f"{chat_template} is not a file", param_hint="--chat-template")
    if curve and curve_dir is not None:
        raise typer.BadParameter("--curve makes fresh keys; --curve-dir uses yours: give one", param_hint="--curve")
    engine_args = tuple(a for a in ctx.args if a != "--")
    pool_args = {"prefill": _split(shlex, prefill_args, "--prefill-args"),
                 "decode": _split(shlex, decode_args, "--decode-args")}
    # vLLM's one-line error now, not a child's traceback later
    parsed = _check_engine_args(engine_args, pool_args)
    placement = None
    if gpus is not None:
        placement = _placement(gpus, engine, planner, {"prefill": 0 if aggregated else prefill,
                                                       "decode": 0 if aggregated else decode,
                                                       "both": aggregated}, parsed)
    model_dir: Optional[Path] = None
    models, given_names = list(model or ()), list(served_model_name or ())
    if len(models) > 1 and given_names and len(given_names) != len(models):
        raise typer.BadParameter(f"{len(given_names)} names for {len(models)} models: give one per --model",
                                 param_hint="--served-model-name")
    all_names: list[tuple[str, ...]] = []
    for i, one in enumerate(models or [None]):
        names = served_names(given_names[i], "") if i < len(given_names) else ()
        if one is not None:
            ref = resolved_model(one)
            validated(ref.path, need_weights=engine == "vllm")
            model_dir = model_dir or ref.path
            if not names:  # the cache's snapshot directory is named by its commit hash
                names = (ref.hub_id,) if ref.hub_id else (() if i == 0 else (ref.name,))
            if i > 0:
                extra_models.append(ExtraModel(ref.path, names))
        all_names.append(names)
    names = all_names[0]
    parse_lora_modules(lora_modules)  # a bad one is a usage error here, not a worker's later
    planner_spec = PlannerSpec(
        slo=planner_slo, profile=planner_profile, interval_s=planner_interval_s, window_s=planner_window_s,
        max_prefill=max_prefill, max_decode=max_decode, decisions_path=planner_decisions, role_switch=role_switch,
        min_dwell_s=planner_min_dwell_s,
        max_workers=max_workers or ((os.cpu_count() or 1) if engine == "vllm" else max_prefill + max_decode))
    num_workers = (aggregated or prefill + decode) * max(len(models), 1)
    if frontends == 0:
        # A planner may grow the pools to max_workers: leave their cores to them.
        frontends = frontends_that_fit(len(os.sched_getaffinity(0)),
                                       planner_spec.max_workers if planner else num_workers,
                                       (0 if router_in_frontend else routers) + (0 if no_kvtier else 1))
    limits = HttpLimits(max_body_mib=max_body_mib, max_header_kib=max_header_kib, header_timeout_s=header_timeout_s,
                        body_timeout_s=body_timeout_s, keepalive_timeout_s=keepalive_timeout_s,
                        max_connections=max_connections)
    spec = GraphSpec(model=model_dir, engine=engine, num_prefill=0 if aggregated else prefill,
                     num_decode=0 if aggregated else decode, num_aggregated=aggregated, router_policy=router_policy,
                     local_prefill_max_tokens=local_prefill_max_tokens,
                     local_prefill_max_stall_ms=local_prefill_max_stall_ms, block_size=block_size, num_blocks=num_blocks,
                     mock_speedup=mock_speedup, mock_profile=mock_profile, mock_start_s=mock_start_s,
                     mock_nixl=mock_nixl, mock_block_bytes=mock_block_bytes,
                     kvtier=not no_kvtier,
                     host_cache_gb=host_cache_gb, disk_cache_gb=disk_cache_gb, disk_cache_dir=disk_cache_dir,
                     kvtier_metrics_port=kvtier_metrics_port, dtype=dtype, kv_transfer=kv_transfer, host=host,
                     port=port,
                     router_port=router_port, router_metrics_port=router_metrics_port, num_routers=routers,
                     router_in_frontend=router_in_frontend,
                     router_prefill_weight=router_prefill_weight, router_busy_threshold=router_busy_threshold,
                     router_idle_decode_prefills=router_idle_decode_prefills,
                     router_link_min_samples=router_link_min_samples,
                     log_level=log_level, log_json=log_json, decode_max_batched_tokens=decode_max_batched_tokens,
                     pin_control_plane=pin_control_plane, cpu_sched=cpu_sched, metrics_sd_file=metrics_sd_file,
                     planner=planner_spec if planner else None, num_frontends=frontends,
                     http_limits=limits, curve=curve,
                     curve_dir=curve_dir, switchable=switchable, served_model_names=names,
                     extra_models=tuple(extra_models), lora_modules=tuple(lora_modules or ()),
                     engine_args=engine_args, prefill_engine_args=pool_args["prefill"],
                     decode_engine_args=pool_args["decode"], placement=placement,
                     frontend_args=frontend_args(chat_template, tool_call_parser, reasoning_parser,
                                                 enable_auto_tool_choice, first_token)
                     + admission_args(max_inflight, max_queued, max_queue_wait_s, ttft_budgets,
                                      default_ttft_budget_s, tenant_weights, reserved_inflight,
                                      reserved_max_priority),
                     otlp_traces_endpoint=otlp_traces_endpoint)
    raise typer.Exit(launch(spec))


def _split(shlex, text: str, flag: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(text))
    except ValueError as exc:
        raise typer.BadParameter(f"{exc} in {text!r}", param_hint=flag) from None


def _check_engine_args(common: tuple[str, ...], pools: dict[str, tuple[str, ...]]) -> dict[str, dict]:
    """Each pool's engine arguments as its workers will parse them (common ones first); exit 2 on vLLM's error.
    What each pool's workers get, by vLLM's dest name ("both": the common ones)."""
    from services.worker.engines.vllm.engine_args import EngineArgsError, parse_engine_args

    out: dict[str, dict] = {"prefill": {}, "decode": {}, "both": {}}
    for pool, own in (("every engine", ()), *pools.items()):
        if not (common or own) or (pool != "every engine" and not own):
            continue
        try:
            given = dict(parse_engine_args((*common, *own), prog="splitserve up").given)
        except EngineArgsError as exc:
            typer.echo(f"error: {exc}" + ("" if pool == "every engine" else f" (--{pool}-args)"), err=True)
            raise typer.Exit(2) from exc
        if pool == "every engine":
            out = {role: dict(given) for role in out}
        else:
            out[pool] = given
    return out


def _placement(gpus: str, engine: str, planner: bool, num_engines: dict[str, int], parsed: dict[str, dict]):
    """``--gpus``: every initial engine's devices (cli/placement.py), or a one-line error and exit 2."""
    from cli.gpus import devices_option, placement_or_exit, pool_demand

    if engine != "vllm":
        raise typer.BadParameter("places vLLM engines (the mock engine uses no GPU)", param_hint="--gpus")
    if planner:
        raise typer.BadParameter("a planner's new workers have no devices placed yet: run fixed pools with "
                                 "--gpus, or start workers with `splitserve worker --gpus`", param_hint="--gpus")
    devices = devices_option(gpus)
    return placement_or_exit(devices, [pool_demand(role, n, parsed[role]) for role, n in num_engines.items()])
