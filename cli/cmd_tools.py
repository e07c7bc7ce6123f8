"""`splitserve keys make`, `splitserve model make-tiny` and `make-tiny-lora`: files a deployment needs."""

from __future__ import annotations

from pathlib import Path

import typer


def keys_make(out: Path = typer.Option(Path("keys"), help="Output directory")) -> None:
    """Write a CURVE keypair per service (router, worker, kvtier, frontend, planner, scaler: who follows the
    planner's ScaleRequests) under OUT/<service>/, with the public keys of the servers it dials and of the clients
    it accepts; give each service its directory (--curve-dir OUT/<service>, or OUT). Secret key files are 0600."""
    from common.security import make_curve_keys

    typer.echo(str(make_curve_keys(out)))


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
