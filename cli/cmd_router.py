"""`splitserve router`: the registry, prefix index and route decisions."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from cli.logs import configure_logging
from cli.options import (
    DEFAULT_ROUTER,
    CurveDir,
    LogJson,
    LogLevel,
    MetricsHost,
    address_checked,
    transport,
)
from cli.runner import run_service
from cli.tracing_setup import OtlpTracesEndpoint, configure_tracing
from services.router.defaults import LOCAL_PREFILL_MAX_STALL_S, LOCAL_PREFILL_MAX_TOKENS

if TYPE_CHECKING:
    from services.router.cost import CostConfig
    from services.router.service import RouterConfig
    from services.router.tier_credit import TierConfig


def router(
    ctx: typer.Context,
    endpoint: str = typer.Option(DEFAULT_ROUTER, envvar="SPLITSERVE_ROUTER", help="ZeroMQ bind address"),
    policy: str = typer.Option("kv", help="kv | round-robin | random | least-loaded"),
    local_prefill_max_tokens: int = typer.Option(LOCAL_PREFILL_MAX_TOKENS, help="Uncached prompt tokens at or below which the "
                                                 "decode worker prefills locally"),
    local_prefill_max_stall_ms: float = typer.Option(LOCAL_PREFILL_MAX_STALL_S * 1e3, help="...and, while that "
                                                     "worker streams, whose predicted prefill stalls its streams "
                                                     "at most this long (inf: any)"),
    events_endpoint: str = typer.Option("", help="ZeroMQ SUB bind address for KV events (default: --endpoint's "
                                        "host, a free port)"),
    events_advertise: str = typer.Option("", help="KV-event address workers are told: an endpoint or a host (the "
                                         "bound port on it). Default: the bound one; bound to 0.0.0.0, each "
                                         "worker dials it at the host it reaches the router at"),
    heartbeat_timeout_s: float = typer.Option(5.0, help="Drop a worker silent this long"),
    metrics_port: int = typer.Option(0, help="Prometheus port (0: none)"),
    metrics_host: str = MetricsHost,
    prefill_weight: Optional[float] = typer.Option(None, help="kv cost: weight of blocks to prefill vs active "
                                                   "decode blocks (default: PolicyConfig's)"),
    queue_weight: Optional[float] = typer.Option(None, help="kv cost: weight of a worker's queued prefill "
                                                 "against the prompt's own (default: PolicyConfig's)"),
    busy_threshold: Optional[float] = typer.Option(None, help="kv: skip workers with more of their KV in use "
                                                   "than this fraction (default: PolicyConfig's)"),
    cost_profile: Optional[Path] = typer.Option(None, help="kv: seed the prefill rate, the same-node link "
                                                "and tier speeds from a profile (splitserve profile's JSON)"),
    prefill_tokens_per_s: Optional[float] = typer.Option(None, help="kv: prefill rate of workers that report "
                                                         "none (default: the profile's, else CostConfig's)"),
    local_prefill_factor: Optional[float] = typer.Option(None, help="kv: local prefill seconds times this (a "
                                                         "decode worker's prefill stalls its streams)"),
    queue_aware_local: bool = typer.Option(False, help="kv: a long prefill queue sends prompts back to their "
                                           "decode worker (default: only the prompt's own work and moving its KV "
                                           "decide local vs remote)"),
    idle_decode_prefills: bool = typer.Option(True, help="kv: a decode worker without streams prefills a prompt "
                                              "itself when it would finish before the busy prefill pool"),
    same_node_bytes_per_s: Optional[float] = typer.Option(None, help="kv: KV link bandwidth within a node "
                                                          "until measured"),
    same_zone_bytes_per_s: Optional[float] = typer.Option(None, help="kv: KV link bandwidth between nodes of "
                                                          "one zone until measured"),
    cross_zone_bytes_per_s: Optional[float] = typer.Option(None, help="kv: KV link bandwidth between zones "
                                                           "until measured"),
    same_node_latency_s: Optional[float] = typer.Option(None, help="kv: fixed seconds per KV move within a node"),
    same_zone_latency_s: Optional[float] = typer.Option(None, help="kv: fixed seconds per KV move in a zone"),
    cross_zone_latency_s: Optional[float] = typer.Option(None, help="kv: fixed seconds per KV move across zones"),
    link_min_samples: Optional[int] = typer.Option(None, help="kv: pulls a link needs before their median "
                                                   "replaces its default (default: TopologyConfig's 3; each "
                                                   "worker pair's first pull, NIXL's wire-up, never counts)"),
    host_tier_bytes_per_s: Optional[float] = typer.Option(None, help="kv: bandwidth of loading a block from the "
                                                          "host tier, which a block there saves against "
                                                          "recomputing it, until learned from tier loads (default: the profile's, "
                                                          "else TierConfig's 2.9e9)"),
    disk_tier_bytes_per_s: Optional[float] = typer.Option(None, help="kv: likewise from the disk tier "
                                                          "(default: the profile's, else TierConfig's 1e9)"),
    curve_dir: Optional[Path] = CurveDir,
    otlp_traces_endpoint: str = OtlpTracesEndpoint,
    log_level: str = LogLevel,
    log_json: bool = LogJson,
) -> None:
    """Run the router: registry, prefix index, route decisions."""
    if ctx.invoked_subcommand is not None:
        return  # `router set-role ...`: the subcommand acts
    from services.router.service import RouterService

    configure_logging(log_level, log_json, "router")
    configure_tracing(otlp_traces_endpoint, "router")
    params = {k: v for k, v in locals().items() if k in _CONFIG_PARAMS}
    run_service(RouterService(router_config(**params)).run)


def router_config_of(args: list[str]) -> RouterConfig:
    """The config `splitserve router ARGS` runs with, for a router inside another process (`frontend
    --router-inside`): the same options, parsed by this command."""
    import typer.main

    app = typer.Typer(add_completion=False)
    app.command()(router)
    parsed = typer.main.get_command(app).make_context("router", list(args)).params
    return router_config(**{k: v for k, v in parsed.items() if k in _CONFIG_PARAMS})


def router_config(endpoint: str, policy: str, local_prefill_max_tokens: int, local_prefill_max_stall_ms: float,
                  events_endpoint: str, events_advertise: str, heartbeat_timeout_s: float, metrics_port: int,
                  metrics_host: str, prefill_weight: float | None, queue_weight: float | None,
                  busy_threshold: float | None, cost_profile: Path | None, prefill_tokens_per_s: float | None,
                  local_prefill_factor: float | None, queue_aware_local: bool, idle_decode_prefills: bool,
                  same_node_bytes_per_s: float | None,
                  same_zone_bytes_per_s: float | None, cross_zone_bytes_per_s: float | None,
                  same_node_latency_s: float | None, same_zone_latency_s: float | None,
                  cross_zone_latency_s: float | None, link_min_samples: int | None,
                  host_tier_bytes_per_s: float | None, disk_tier_bytes_per_s: float | None,
                  curve_dir: Path | None) -> RouterConfig:
    from services.router.policy import PolicyConfig
    from services.router.service import RouterConfig

    from common.addresses import check_advertised, default_events_bind

    address_checked(check_advertised, events_advertise, "--events-advertise")
    events_bind = events_endpoint or address_checked(default_events_bind, endpoint)
    links = {k: v for k, v in (("same_node_bytes_per_s", same_node_bytes_per_s),
                               ("same_zone_bytes_per_s", same_zone_bytes_per_s),
                               ("cross_zone_bytes_per_s", cross_zone_bytes_per_s),
                               ("same_node_latency_s", same_node_latency_s),
                               ("same_zone_latency_s", same_zone_latency_s),
                               ("cross_zone_latency_s", cross_zone_latency_s),
                               ("min_samples", link_min_samples)) if v is not None}
    cost = _cost_config(cost_profile, links, {k: v for k, v in (("prefill_tokens_per_s", prefill_tokens_per_s),
                                                                ("local_prefill_factor", local_prefill_factor),
                                                                ("queue_aware_local", queue_aware_local or None),
                                                                ("idle_decode_prefills",
                                                                 None if idle_decode_prefills else False))
                                              if v is not None})
    config = RouterConfig(endpoint=endpoint, events_endpoint=events_bind, events_advertise=events_advertise,
                          heartbeat_timeout_s=heartbeat_timeout_s, metrics_port=metrics_port,
                          metrics_host=metrics_host,
                          transport=transport(curve_dir, "router"),
                          policy=PolicyConfig(policy=policy, local_prefill_max_tokens=local_prefill_max_tokens,
                                              local_prefill_max_stall_s=local_prefill_max_stall_ms / 1e3,
                                              cost=cost,
                                              tiers=_tier_config(cost_profile, host_tier_bytes_per_s,
                                                                 disk_tier_bytes_per_s),
                                              **{k: v for k, v in (("prefill_weight", prefill_weight),
                                                                   ("queue_weight", queue_weight),
                                                                   ("busy_threshold", busy_threshold))
                                                 if v is not None}))
    return config


# router()'s options that make its RouterConfig (the rest: logging and tracing, set up by the process).
_CONFIG_PARAMS = frozenset(inspect.signature(router_config).parameters)


def _tier_config(profile: Path | None, host_bytes_per_s: float | None,
                 disk_bytes_per_s: float | None) -> TierConfig:
    """The tier speeds the router starts from (it learns them from the workers' tier loads after): TierConfig's
    defaults, a profile's ``tiers`` figures over them where it has some, then each bandwidth flag."""
    from common.profile import load_profile, tier_fields
    from services.router.tier_credit import TierConfig

    try:
        seed = tier_fields(load_profile(profile)) if profile is not None else {}
        return TierConfig(**{**seed, **{k: v for k, v in (("host_bytes_per_s", host_bytes_per_s),
                                                          ("disk_bytes_per_s", disk_bytes_per_s)) if v is not None}})
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


def _cost_config(profile: Path | None, links: dict[str, float | int], overrides: dict[str, float | bool]) -> CostConfig:
    """The kv policy's cost defaults: a profile's figures if given, then each flag set over them."""
    from dataclasses import replace

    from common.profile import load_timing
    from services.router.cost import CostConfig

    base = CostConfig.from_timing(load_timing(profile)) if profile is not None else CostConfig()
    try:
        return replace(base, topology=replace(base.topology, **links), **overrides)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
