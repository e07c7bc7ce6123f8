"""`splitserve up`: a whole local graph (router, workers, kvtier, frontend, planner) as child processes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from cli.logs import configure_logging
from cli.options import (
    DTYPE_HELP,
    LogJson,
    LogLevel,
)
from services.planner import defaults as planner_defaults
from services.router.defaults import LOCAL_PREFILL_MAX_TOKENS


def up(
    model: Optional[Path] = typer.Option(None, help="HF model directory (default: the embedded tiny model)"),
    engine: str = typer.Option("vllm", help="mock | vllm"),
    prefill: int = typer.Option(1, help="Prefill workers"),
    decode: int = typer.Option(1, help="Decode workers"),
    aggregated: int = typer.Option(0, help="Workers with role both (replaces the P/D pools when > 0)"),
    router_policy: str = typer.Option("kv"),
    local_prefill_max_tokens: int = typer.Option(LOCAL_PREFILL_MAX_TOKENS),
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
    planner_slo: str = typer.Option(planner_defaults.SLO, help="The planner's SLOs (p90)"),
    planner_profile: Optional[Path] = typer.Option(None, help="`splitserve profile` JSON: scale ahead of the SLO"),
    planner_interval_s: float = typer.Option(planner_defaults.INTERVAL_S, help="Seconds between planner decisions"),
    planner_window_s: float = typer.Option(planner_defaults.WINDOW_S, help="Seconds of metrics each planner decision reads"),
    max_prefill: int = typer.Option(planner_defaults.MAX_PREFILL, help="Planner: most prefill workers"),
    max_decode: int = typer.Option(planner_defaults.MAX_DECODE, help="Planner: most decode workers"),
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
