"""The tiny model's LoRA adapter and a copy of the tiny model under another name, made once per checkout (both
deterministic, so sharing them is safe): what the multi-model and LoRA tests serve (docs/fleet.md)."""

from __future__ import annotations

import shutil
from pathlib import Path

from common.tiny_lora import make_tiny_lora
from tests.harness.graph import REPO, tiny_model_dir


def tiny_lora_dir(name: str = "tiny-lora", seed: int = 1) -> Path:
    path = REPO / "models" / name
    if not (path / "adapter_config.json").exists():
        make_tiny_lora(tiny_model_dir(), path, seed=seed)
    return path


def tiny_copy_dir() -> Path:
    """The tiny model's files under another directory name: a second model (served as "tiny-copy")."""
    path = REPO / "models" / "tiny-copy"
    if not (path / "config.json").exists():
        tmp = path.with_name(path.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(tiny_model_dir(), tmp)
        tmp.rename(path)
    return path
