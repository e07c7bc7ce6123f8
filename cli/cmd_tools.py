"""`splitserve keys make` and `splitserve model make-tiny`: files a deployment needs."""

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
