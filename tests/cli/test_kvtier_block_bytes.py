"""kvtier's slot size as `splitserve up` passes it (--block-bytes): the bytes of one KV block of the workers' engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.graph_spec import GraphSpec, kvtier_block_bytes
from common.tiny_model import make_tiny_model, validate_model_dir
from services.worker.engines.vllm.dtype import cpu_has_fast_bf16


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("kvtier-slot") / "tiny")  # a float32 model


@pytest.mark.parametrize(
    ("dtype", "dtype_bytes"),
    [
        # vLLM 0.32's `auto` runs a float32 model in 16 bits (bf16 on CPU, fp16/bf16 on GPU): the worker logged
        # 65,536-byte blocks for the tiny model while `up` sized kvtier's slots for float32 (131,072). On a CPU
        # that emulates bf16 the engine is given float32 instead (services/worker/engines/vllm/dtype.py).
        ("auto", 2 if cpu_has_fast_bf16() else 4),
        ("bfloat16", 2),
        ("float32", 4),
    ],
)
def test_vllm_block_bytes_follow_the_engines_dtype(tiny: Path, dtype: str, dtype_bytes: int) -> None:
    info = validate_model_dir(tiny)
    assert info.torch_dtype == "float32"
    spec = GraphSpec(model=tiny, engine="vllm", block_size=32, dtype=dtype)
    # (K and V) * layers * KV heads * head dim * dtype bytes * tokens a block
    assert kvtier_block_bytes(spec) == 2 * info.num_layers * info.num_kv_heads * info.head_dim * dtype_bytes * 32


def test_mock_block_bytes_are_its_modelled_engines() -> None:
    assert kvtier_block_bytes(GraphSpec(engine="mock", block_size=32)) == 36864 * 32
