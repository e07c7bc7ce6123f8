"""`splitserve frontend`: the OpenAI-compatible HTTP server."""

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
    validated,
)
from cli.runner import run_service


def frontend(
    model: Path = typer.Option(..., help="HF model directory (tokenizer, chat template)"),
    served_model_name: Optional[str] = typer.Option(None),
    router_endpoint: str = typer.Option(DEFAULT_ROUTER, "--router", envvar="SPLITSERVE_ROUTER",
                                        help="Router endpoint, or several replicas comma-separated (any live one answers)"),
    host: str = typer.Option("127.0.0.1", envvar="SPLITSERVE_HOST"),
    port: int = typer.Option(8000, envvar="SPLITSERVE_PORT"),
    max_body_mib: float = typer.Option(8.0, help="Largest request body accepted"),
    migration_limit: int = typer.Option(3, help="Times a request may move after losing its worker"),
    migration_wait_s: float = typer.Option(30.0, help="Seconds a request that lost its worker waits for a capable "
                                           "one (restarted or new) before it fails"),
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
    validated(model, need_weights=False)  # tokenizer and config only
    config = FrontendConfig(
        model_name=served_model_name or model.resolve().name, model_dir=model,
        pipeline=PipelineConfig(router_endpoint=router_endpoint, migration_limit=migration_limit,
                                migration_wait_s=migration_wait_s,
                                transport=transport(curve_dir, "frontend")),
        http=HttpConfig(host=host, port=port, max_body_bytes=int(max_body_mib * 1024 * 1024)),
        api_key=api_key, max_inflight_requests=max_inflight)
    run_service(FrontendService(config).run)
