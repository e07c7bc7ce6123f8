"""The tier mover on CUDA: the CPU tests' checks (tests/harness/tier_mover_checks.py) with the KV cache in GPU
memory, pinned host buffers and the side stream. Runs wherever torch sees a GPU."""

from __future__ import annotations

import pytest
import torch

from tests.harness import tier_mover_checks as checks

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU on this machine")


@pytest.mark.parametrize("split_kv", [False, True])
def test_save_round_trip(split_kv: bool) -> None:
    checks.check_save_round_trip("cuda", split_kv)


@pytest.mark.parametrize("split_kv", [False, True])
def test_load_round_trip(split_kv: bool) -> None:
    checks.check_load_round_trip("cuda", split_kv)


@pytest.mark.parametrize("split_kv", [False, True])
def test_staged_load_round_trip(split_kv: bool) -> None:
    checks.check_staged_load_round_trip("cuda", split_kv)


def test_copy_follows_queued_writes() -> None:
    checks.check_copy_follows_queued_writes("cuda")
