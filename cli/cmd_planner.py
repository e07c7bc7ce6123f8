"""`splitserve planner` and `planner-events`: live pool sizing and its ScaleRequests."""

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
    transport,
)
from cli.runner import run_service
from services.planner import defaults as planner_defaults


def planner_cmd(
    router_endpoint: str = typer.Option(DEFAULT_ROUTER, "--router", envvar="SPLITSERVE_ROUTER"),
    metrics_url: list[str] = typer.Option(["http://127.0.0.1:8000/metrics"], help="Frontend /metrics (repeatable)"),
    events: str = typer.Option(planner_defaults.EVENTS_ENDPOINT, help="PUB socket for ScaleRequests (orchestrators subscribe)"),
    slo: str = typer.Option(planner_defaults.SLO, help="p90 targets: ttft_ms=..,itl_ms=.."),
    profile_path: Optional[Path] = typer.Option(None, "--profile", help="`splitserve profile` JSON (model-based targets)"),
    interval_s: float = typer.Option(planner_defaults.INTERVAL_S, help="Seconds between decisions"),
    window_s: float = typer.Option(planner_defaults.WINDOW_S, help="Each decision reads this many seconds of metrics"),
    min_prefill: int = typer.Option(1),
    max_prefill: int = typer.Option(planner_defaults.MAX_PREFILL),
    min_decode: int = typer.Option(1),
    max_decode: int = typer.Option(planner_defaults.MAX_DECODE),
    max_workers: int = typer.Option(planner_defaults.MAX_WORKERS, help="Most prefill + decode workers"),
    down_after_intervals: int = typer.Option(3, help="Quiet intervals in a row before a worker is drained"),
    decisions: Optional[Path] = typer.Option(None, help="Append each interval's observation and decision (JSON lines)"),
    role_switch: bool = typer.Option(False, "--role-switch/--no-role-switch",
                                     help="Move switchable workers between pools in place (SetRole) before starting or "
                                     "stopping any"),
    min_dwell_s: float = typer.Option(30.0, help="--role-switch: seconds a worker stays in a pool before it "
                                      "moves again"),
    scaler: str = typer.Option("none", help="Act on the ScaleRequests: none (publish only) | kubernetes (patch the "
                               "pools' Deployments' scale; needs the extra `kubernetes` and deploy/kubernetes/ RBAC)"),
    k8s_namespace: Optional[str] = typer.Option(None, help="--scaler kubernetes: the pools' namespace (default: "
                                                "this pod's)"),
    curve_dir: Optional[Path] = CurveDir,
    log_level: str = LogLevel,
    log_json: bool = LogJson,
) -> None:
    """Watch the graph's latency, queues and KV usage; publish how many prefill and decode workers it needs."""
    from services.planner.policy import PlannerConfig
    from services.planner.service import PlannerService, PlannerServiceConfig
    from services.planner.switch import SwitchConfig
    from services.planner.workload import Slo

    configure_logging(log_level, log_json, "planner")
    try:
        slo_parsed = Slo.parse(slo)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    timing, options = None, None
    if profile_path is not None:
        from services.planner.profile import load_plan_inputs

        try:
            timing, options = load_plan_inputs(profile_path)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            typer.echo(f"error: --profile {profile_path}: {exc}", err=True)
            raise typer.Exit(2) from exc
    policy = PlannerConfig(slo=slo_parsed, min_prefill=min_prefill, max_prefill=max_prefill, min_decode=min_decode,
                           max_decode=max_decode, max_workers=max_workers, down_after_intervals=down_after_intervals)
    config = PlannerServiceConfig(router_endpoint=router_endpoint, metrics_urls=tuple(metrics_url), policy=policy,
                                  events_endpoint=events, interval_s=interval_s, window_s=window_s, timing=timing,
                                  decisions_path=decisions, transport=transport(curve_dir, "planner"),
                                  role_switch=role_switch, switch=SwitchConfig(min_dwell_s=min_dwell_s),
                                  **({"plan_options": options} if options is not None else {}))
    if scaler == "none":
        run_service(PlannerService(config).run)
        return
    if scaler != "kubernetes":
        raise typer.BadParameter(f"--scaler {scaler}: none | kubernetes")
    if role_switch:
        # A pool is a Deployment there: a moved pod still counts in its old one, so the pools' sizes would disagree.
        raise typer.BadParameter("--role-switch with --scaler kubernetes: not supported (pods do not change Deployment)")
    from services.planner.kube_scaler import KubernetesScaler, load_apps_api, pod_namespace, run_beside

    try:
        kube = KubernetesScaler(load_apps_api(), k8s_namespace or pod_namespace(), max_replicas=max_workers)
    except Exception as exc:  # no client installed, no in-cluster or kubeconfig credentials
        typer.echo(f"error: --scaler kubernetes: {exc}", err=True)
        raise typer.Exit(2) from exc
    service = PlannerService(config)
    run_service(lambda: run_beside(service, kube))


def planner_events(
    events: str = typer.Option(planner_defaults.EVENTS_ENDPOINT, help="The planner's PUB socket"),
    count: int = typer.Option(0, help="Exit after this many (0: never)"),
    curve_dir: Optional[Path] = CurveDir,
) -> None:
    """Print the planner's ScaleRequests as JSON lines, for an orchestrator script (systemd, kubectl)."""
    import json

    import zmq

    from common.errors import ProtocolError
    from common.protocol import ScaleRequest, decode

    from services.planner.subscribe import subscribe_scale_requests

    ctx = zmq.Context()
    sub = subscribe_scale_requests(ctx, events, transport(curve_dir, "scaler").curve)  # `keys make`'s OUT/scaler
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
