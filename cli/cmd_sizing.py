"""`splitserve profile` and `splitserve plan`: measure an engine, size the pools for a workload."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from cli.options import (
    DTYPE_HELP,
    reexec_with_engine_env,
    validated,
)


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

    from common.profile import write_profile
    from services.worker.engines import profile as prof

    spec = prof.QUICK if quick else prof.ProfileSpec()
    if max_seconds is not None:
        spec = dataclasses.replace(spec, max_seconds=max_seconds)
    say = lambda msg: typer.echo(msg, err=True)  # noqa: E731
    if engine == "mock":
        from common.timing import TimingModel

        doc = asyncio.run(prof.profile_mock(spec, TimingModel(speedup=mock_speedup), block_size, log=say))
    elif engine == "vllm":
        from services.worker.engines.vllm.config import engine_process_env

        if model == Path("models/tiny") and not (model / "config.json").exists():
            from common.tiny_model import make_tiny_model

            make_tiny_model(model)
        validated(model)
        config = prof.vllm_config_for(model, spec, dtype, block_size, kv_cache_gib)
        reexec_with_engine_env({**engine_process_env(config, core), "VLLM_LOGGING_LEVEL": "WARNING"})
        doc = asyncio.run(prof.profile_vllm(config, spec, log=say))
    else:
        raise typer.BadParameter(f"engine must be mock or vllm, not {engine!r}")
    write_profile(doc, output)
    fit = doc["fit"]
    typer.echo(f"wrote {output} ({doc['conditions']['elapsed_s']:.0f} s, fit max error prefill "
               f"{fit['prefill_max_rel_err']:.1%}, decode {fit['decode_max_rel_err']:.1%})")


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

    from services.planner.display import format_plan
    from services.planner.plan import plan as plan_pools
    from services.planner.profile import load_plan_inputs
    from services.planner.workload import Slo, Workload

    try:
        timing, options = load_plan_inputs(profile_path, max_batch=max_batch, chunk_tokens=chunk_tokens)
        workload = Workload.of([int(x) for x in isl.split(",")], [int(x) for x in osl.split(",")],
                               rate=rate, concurrency=concurrency)
        result = plan_pools(timing, workload, Slo.parse(slo), options)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(json.dumps(result.to_dict(), indent=2) if as_json else format_plan(result))
