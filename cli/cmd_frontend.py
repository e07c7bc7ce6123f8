"""`splitserve frontend`: the OpenAI-compatible HTTP server."""

from __future__ import annotations

from pathlib import Path

import typer

from cli.logs import configure_logging
from cli.options import (
    DEFAULT_ROUTER,
    CurveDir,
    LogJson,
    LogLevel,
    MetricsHost,
    transport,
    validated,
)
from cli.runner import run_service


def frontend(
    model: Path = typer.Option(..., help="HF model directory (tokenizer, chat template)"),
    served_model_name: str | None = typer.Option(None),
    router_endpoint: str = typer.Option(DEFAULT_ROUTER, "--router", envvar="SPLITSERVE_ROUTER",
                                        help="Router endpoint, or several replicas comma-separated (any live one answers)"),
    host: str = typer.Option("127.0.0.1", envvar="SPLITSERVE_HOST"),
    port: int = typer.Option(8000, envvar="SPLITSERVE_PORT"),
    max_body_mib: float = typer.Option(8.0, help="Largest request body accepted"),
    max_header_kib: float = typer.Option(64.0, help="Largest request line + headers (431 beyond)"),
    header_timeout_s: float = typer.Option(10.0, help="Seconds a client has to send a request's headers"),
    body_timeout_s: float = typer.Option(30.0, help="Seconds a client has to send a request's body"),
    keepalive_timeout_s: float = typer.Option(15.0, help="Seconds an idle keep-alive connection stays open"),
    max_connections: int = typer.Option(4096, help="Open HTTP connections beyond which new ones get 503"),
    reuse_port: bool = typer.Option(True, help="SO_REUSEPORT: several frontend processes may share the port"),
    migration_limit: int = typer.Option(3, help="Times a request may move after losing its worker"),
    migration_wait_s: float = typer.Option(30.0, help="Seconds a request that lost its worker waits for a capable "
                                           "one (restarted or new) before it fails"),
    api_key: str = typer.Option("", envvar="SPLITSERVE_API_KEY",
                                help="Require this Bearer key on every path but --open-paths"),
    open_paths: str = typer.Option("/health,/metrics,/dashboard", help="Paths served without the API key"),
    log_prompts: bool = typer.Option(False, help="Log each request's prompt text (off: never logged)"),
    tokenizer_threads: int = typer.Option(2, help="Threads that template and tokenize long prompts"),
    metrics_port: int = typer.Option(0, help="This process's own Prometheus port (0: /metrics on --port only)"),
    metrics_host: str = MetricsHost,
    max_inflight: int = typer.Option(4096, envvar="SPLITSERVE_MAX_INFLIGHT",
                                     help="Requests in flight before new ones get 503"),
    curve_dir: Path | None = CurveDir,
    log_level: str = LogLevel,
    log_json: bool = LogJson,
) -> None:
    """Run the OpenAI-compatible HTTP frontend."""
    from services.frontend.http import HttpConfig
    from services.frontend.pipeline import PipelineConfig
    from services.frontend.service import FrontendConfig, FrontendService

    configure_logging(log_level, log_json, "frontend")
    validated(model, need_weights=False)  # tokenizer and config only
    config = FrontendConfig(
        model_name=served_model_name or model.resolve().name, model_dir=model,
        pipeline=PipelineConfig(router_endpoint=router_endpoint, migration_limit=migration_limit,
                                migration_wait_s=migration_wait_s,
                                transport=transport(curve_dir, "frontend")),
        http=HttpConfig(host=host, port=port, max_body_bytes=int(max_body_mib * 1024 * 1024),
                        max_header_bytes=int(max_header_kib * 1024), header_timeout_s=header_timeout_s,
                        body_timeout_s=body_timeout_s, keepalive_timeout_s=keepalive_timeout_s,
                        max_connections=max_connections, reuse_port=reuse_port),
        api_key=api_key, max_inflight_requests=max_inflight, log_prompts=log_prompts,
        open_paths=tuple(p for p in open_paths.split(",") if p), num_tokenizer_threads=tokenizer_threads,
        metrics_port=metrics_port, metrics_host=metrics_host)
    run_service(FrontendService(config).run)
