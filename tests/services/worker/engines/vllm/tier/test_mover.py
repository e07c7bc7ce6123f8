"""The tier mover on CPU (tests/gpu/test_tier_mover_cuda.py runs the same checks on CUDA): packed blocks to host
memory and back, bytes checked, for both KV cache shapes."""

from __future__ import annotations

import pytest

from tests.harness import tier_mover_checks as checks


@pytest.mark.parametrize("split_kv", [False, True])
def test_save_round_trip(split_kv: bool) -> None:
    checks.check_save_round_trip("cpu", split_kv)


@pytest.mark.parametrize("split_kv", [False, True])
def test_load_round_trip(split_kv: bool) -> None:
    checks.check_load_round_trip("cpu", split_kv)


@pytest.mark.parametrize("split_kv", [False, True])
def test_staged_load_round_trip(split_kv: bool) -> None:
    checks.check_staged_load_round_trip("cpu", split_kv)


def test_copy_follows_queued_writes() -> None:
    checks.check_copy_follows_queued_writes("cpu")


def test_cpu_moves_no_bytes() -> None:
    import torch

    from services.worker.engines.vllm.tier.mover import TierMover

    blocks = torch.zeros((2, 8), dtype=torch.uint8)
    mover = TierMover("cpu")
    assert mover.to_host(blocks).tensor is blocks and mover.to_device(blocks) is blocks  # the same tensors
