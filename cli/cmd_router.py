"""`splitserve router`: the registry, prefix index and route decisions."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

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


def router(
    endpoint: str = typer.Option(DEFAULT_ROUTER, envvar="SPLITSERVE_ROUTER", help="ZeroMQ bind address"),
    policy: str = typer.Option("kv", help="kv | round-robin | random | least-loaded"),
    local_prefill_max_tokens: int = typer.Option(256, help="Uncached prompt tokens at or below which the "
                                                 "decode worker prefills locally"),
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
    busy_threshold: Optional[float] = typer.Option(None, help="kv: skip workers with more of their KV in use "
                                                   "than this fraction (default: PolicyConfig's)"),
    curve_dir: Optional[Path] = CurveDir,
    log_level: str = LogLevel,
    log_json: bool = LogJson,
) -> None:
    """Run the router: registry, prefix index, route decisions."""
    from services.router.policy import PolicyConfig
    from services.router.service import RouterConfig, RouterService

    from common.addresses import check_advertised, default_events_bind

    configure_logging(log_level, log_json, "router")
    address_checked(check_advertised, events_advertise, "--events-advertise")
    events_bind = events_endpoint or address_checked(default_events_bind, endpoint)
    config = RouterConfig(endpoint=endpoint, events_endpoint=events_bind, events_advertise=events_advertise,
                          heartbeat_timeout_s=heartbeat_timeout_s, metrics_port=metrics_port,
                          metrics_host=metrics_host,
                          transport=transport(curve_dir),
                          policy=PolicyConfig(policy=policy, local_prefill_max_tokens=local_prefill_max_tokens,
                                              **{k: v for k, v in (("prefill_weight", prefill_weight),
                                                                   ("busy_threshold", busy_threshold))
                                                 if v is not None}))
    run_service(RouterService(config).run)

