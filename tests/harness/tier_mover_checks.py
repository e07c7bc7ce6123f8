"""The tier mover's checks, one body for every device: tests/services/.../tier/test_mover.py runs them on CPU,
tests/gpu/test_tier_mover_cuda.py on CUDA. Each returns nothing and asserts bytes."""

from __future__ import annotations

import torch

from services.worker.engines.vllm.tier.layout import KvLayout
from services.worker.engines.vllm.tier.mover import TierMover

NUM_BLOCKS = 16


def kv_caches(device: str, split_kv: bool, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """Three layers of random KV: CPU attention's [num_blocks, heads, block_size, 2*head] or a GPU backend's
    [2, num_blocks, block_size, heads, head] (K and V split)."""
    gen = torch.Generator().manual_seed(7)
    shape = (2, NUM_BLOCKS, 32, 2, 16) if split_kv else (NUM_BLOCKS, 2, 32, 32)
    return {f"model.layers.{i}.self_attn.attn": torch.randn(shape, generator=gen).to(dtype).to(device)
            for i in range(3)}


def expected_block(caches: dict[str, torch.Tensor], block_id: int, split_kv: bool) -> bytes:
    out = b""
    for i in range(3):
        t = caches[f"model.layers.{i}.self_attn.attn"].cpu()
        slabs = [t[0][block_id], t[1][block_id]] if split_kv else [t[block_id]]
        out += b"".join(s.contiguous().view(torch.uint8).numpy().tobytes() for s in slabs)
    return out


def check_save_round_trip(device: str, split_kv: bool) -> None:
    """pack on the device -> host: every block's bytes as the cache holds them, in host memory (pinned on CUDA)."""
    caches = kv_caches(device, split_kv)
    layout = KvLayout.from_kv_caches(caches, NUM_BLOCKS)
    mover = TierMover(device)
    ids = [5, 0, 15, 7]
    copy = mover.to_host(layout.pack(ids))
    host = copy.wait()
    assert copy.done() and host.device.type == "cpu" and host.shape == (len(ids), layout.block_bytes)
    assert host.is_pinned() == mover.on_cuda
    for row, block_id in enumerate(ids):
        assert host[row].numpy().tobytes() == expected_block(caches, block_id, split_kv)


def check_load_round_trip(device: str, split_kv: bool) -> None:
    """Host bytes -> the device -> unpack: the planned blocks hold them, every other block is untouched."""
    caches = kv_caches(device, split_kv)
    layout = KvLayout.from_kv_caches(caches, NUM_BLOCKS)
    mover = TierMover(device)
    before = {n: t.clone() for n, t in caches.items()}
    source = [1, 2]
    host = torch.frombuffer(bytearray(b"".join(expected_block(caches, b, split_kv) for b in source)),
                            dtype=torch.uint8).view(len(source), layout.block_bytes)  # pageable, as the wire's
    targets = [9, 4]
    layout.unpack(targets, mover.to_device(host))
    for target, src in zip(targets, source):
        assert expected_block(caches, target, split_kv) == expected_block(before, src, split_kv)
    for other in set(range(NUM_BLOCKS)) - set(targets):
        assert expected_block(caches, other, split_kv) == expected_block(before, other, split_kv)


def check_staged_load_round_trip(device: str, split_kv: bool) -> None:
    """Fetched blocks (one ``bytes`` each, as kvtier's reply holds them) staged, moved and unpacked: the planned
    blocks hold them, every other block is untouched, and the staging is pinned where it feeds a GPU copy."""
    caches = kv_caches(device, split_kv)
    layout = KvLayout.from_kv_caches(caches, NUM_BLOCKS)
    mover = TierMover(device)
    before = {n: t.clone() for n, t in caches.items()}
    source, targets = [3, 0, 5], [7, 2, 6]
    staged = mover.stage([expected_block(caches, b, split_kv) for b in source], layout.block_bytes)
    assert staged.shape == (len(source), layout.block_bytes) and staged.is_pinned() == mover.on_cuda
    layout.unpack(targets, mover.to_device(staged))
    for target, src in zip(targets, source):
        assert expected_block(caches, target, split_kv) == expected_block(before, src, split_kv)
    for other in set(range(NUM_BLOCKS)) - set(targets):
        assert expected_block(caches, other, split_kv) == expected_block(before, other, split_kv)


def check_copy_follows_queued_writes(device: str) -> None:
    """A save right after the engine wrote its blocks (no synchronize between) carries the new bytes: the side
    stream's copy starts after the work already queued."""
    caches = kv_caches(device, split_kv=True)
    layout = KvLayout.from_kv_caches(caches, NUM_BLOCKS)
    mover = TierMover(device)
    for t in caches.values():
        t.mul_(0).add_(3)  # queued on the engine's stream
    host = mover.to_host(layout.pack(list(range(NUM_BLOCKS)))).wait()
    assert bool((host.view(torch.bfloat16) == 3).all())
    mover.synchronize()
