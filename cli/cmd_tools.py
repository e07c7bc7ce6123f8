"""`splitserve keys make`, `splitserve model make-tiny` and `make-tiny-lora`: files a deployment needs."""

from __future__ import annotations

from pathlib import Path

import typer


def keys_make(
    out: Path = typer.Option(Path("keys"), help="Output directory"),
    if_absent: bool = typer.Option(False, "--if-absent", help="Keep the keys OUT already holds for every service "
                                   "(a one-shot key step run again: compose.yaml's `keys` service)"),
    services: str = typer.Option("router,worker,kvtier,frontend,planner,scaler", "--services",
                                 help="Only these services, comma-separated (and only their allow-lists)"),
) -> None:
    """Write a CURVE keypair per service (router, worker, kvtier, frontend, planner, scaler: who follows the
    planner's ScaleRequests) under OUT/<service>/, with the public keys of the servers it dials and of the clients
    it accepts; give each service its directory (--curve-dir OUT/<service>, or OUT). Secret key files are 0600."""
    from common.security import SERVICES, curve_keys_present, make_curve_keys

    chosen = tuple(s.strip() for s in services.split(",") if s.strip())
    unknown = sorted(set(chosen) - set(SERVICES))
    if unknown or not chosen:
        raise typer.BadParameter(f"unknown services {unknown}: choose from {', '.join(SERVICES)}",
                                 param_hint="--services")
    if if_absent and curve_keys_present(out, chosen):
        typer.echo(f"{out}: keys present, kept")
        return
    typer.echo(str(make_curve_keys(out, chosen)))


def make_tiny(
    out: Path = typer.Option(Path("models/tiny"), help="Output directory"),
    size: str = typer.Option("tiny", help="tiny (6.6M params) | 100m"),
    seed: int = typer.Option(0),
) -> None:
    """Write a deterministic HF-format Llama directory (random weights, locally trained tokenizer)."""
    from common.tiny_model import make_tiny_model

    path = make_tiny_model(out, size=size, seed=seed)  # type: ignore[arg-type]
    typer.echo(str(path))


def make_tiny_lora(
    model: Path = typer.Option(Path("models/tiny"), help="The model directory the adapter is for (make-tiny's)"),
    out: Path = typer.Option(Path("models/tiny-lora"), help="Output directory"),
    rank: int = typer.Option(8, help="LoRA rank r"),
    seed: int = typer.Option(1),
) -> None:
    """Write a LoRA adapter with random weights for MODEL in PEFT's layout (adapter_config.json,
    adapter_model.safetensors): what `--lora-modules NAME=OUT` and /v1/load_lora_adapter load."""
    from common.tiny_lora import make_tiny_lora as make

    typer.echo(str(make(model, out, rank=rank, seed=seed)))
