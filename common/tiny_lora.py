"""A LoRA adapter for a model directory made by common/tiny_model.py: random weights in PEFT's layout
(adapter_config.json + adapter_model.safetensors), what vLLM's ``--lora-modules name=path`` and
``/v1/load_lora_adapter`` load. Both A and B are random (PEFT starts B at zero, which would change nothing), so
outputs with the adapter differ from the base model's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import structlog
from safetensors.numpy import save_file

log = structlog.get_logger(__name__)

# Attention projections only: the smallest adapter vLLM's punica kernels apply on every layer.
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
# Large enough against the base weights' 0.02 std that greedy outputs change within a few tokens.
_LORA_STD = 0.2


def make_tiny_lora(model_dir: Path, out_dir: Path, rank: int = 8, seed: int = 1) -> Path:
    """Write a rank-``rank`` adapter for the Llama at ``model_dir`` to ``out_dir`` and return it."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    hidden, head_dim = config["hidden_size"], config["head_dim"]
    q_out, kv_out = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    # Linear shapes (out_features, in_features) per target.
    shapes = {"q_proj": (q_out, hidden), "k_proj": (kv_out, hidden), "v_proj": (kv_out, hidden),
              "o_proj": (hidden, q_out)}
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for i in range(config["num_hidden_layers"]):
        for name in TARGET_MODULES:
            out_features, in_features = shapes[name]
            prefix = f"base_model.model.model.layers.{i}.self_attn.{name}"
            tensors[f"{prefix}.lora_A.weight"] = (rng.standard_normal((rank, in_features)) * _LORA_STD).astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = (rng.standard_normal((out_features, rank)) * _LORA_STD).astype(np.float32)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "adapter_model.safetensors"), metadata={"format": "pt"})
    (out_dir / "adapter_model.safetensors").chmod(0o644)
    (out_dir / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(model_dir), "r": rank,
        "lora_alpha": rank, "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
        "target_modules": list(TARGET_MODULES), "modules_to_save": None}, indent=1))
    log.info("tiny_lora_written", path=str(out_dir), rank=rank, seed=seed)
    return out_dir
