"""The packing of one vLLM KV block into one kvtier block: exact byte order, round trips, both cache shapes."""

from __future__ import annotations

import pytest
import torch

from common.errors import EngineError
from services.worker.engines.vllm.tier.layout import KvLayout, layer_order

NUM_BLOCKS = 5


def _cpu_caches(dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """vLLM CPU attention's shape: [num_blocks, num_kv_heads, block_size, 2 * head_size]; 3 layers, out of order."""
    caches = {}
    for layer in (10, 2, 1):
        t = torch.arange(NUM_BLOCKS * 2 * 4 * 6, dtype=torch.float32).reshape(NUM_BLOCKS, 2, 4, 6) + 1000 * layer
        caches[f"model.layers.{layer}.self_attn.attn"] = t.to(dtype)
    return caches


def test_layers_sort_by_number() -> None:
    assert layer_order(["l.10.a", "l.2.a", "l.1.a"]) == ["l.1.a", "l.2.a", "l.10.a"]


def test_block_is_every_layer_slab_in_layer_order() -> None:
    caches = _cpu_caches()
    layout = KvLayout.from_kv_caches(caches, NUM_BLOCKS)
    slab = 2 * 4 * 6 * 4  # bytes of one block in one layer
    assert layout.part_bytes == (slab, slab, slab) and layout.block_bytes == 3 * slab
    packed = layout.pack([3, 0])
    assert packed.shape == (2, 3 * slab) and packed.dtype == torch.uint8
    expected = b"".join(caches[f"model.layers.{n}.self_attn.attn"][3].numpy().tobytes() for n in (1, 2, 10))
    assert packed[0].numpy().tobytes() == expected
    assert packed[1, :slab].numpy().tobytes() == caches["model.layers.1.self_attn.attn"][0].numpy().tobytes()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unpack_writes_exactly_the_given_blocks(dtype: torch.dtype) -> None:
    src = KvLayout.from_kv_caches(_cpu_caches(dtype), NUM_BLOCKS)
    dst_caches = {k: torch.zeros_like(v) for k, v in _cpu_caches(dtype).items()}
    dst = KvLayout.from_kv_caches(dst_caches, NUM_BLOCKS)
    dst.unpack([4, 1], src.pack([0, 2]))  # another worker's blocks 0, 2 land in our blocks 4, 1
    for name, t in _cpu_caches(dtype).items():
        assert torch.equal(dst_caches[name][4], t[0]) and torch.equal(dst_caches[name][1], t[2])
        assert not dst_caches[name][[0, 2, 3]].any()


def test_split_k_v_shape_packs_k_then_v_per_layer() -> None:
    caches = {f"layers.{i}": torch.randn(2, NUM_BLOCKS, 4, 2, 8) for i in range(2)}  # [2, blocks, bs, heads, dim]
    layout = KvLayout.from_kv_caches(caches, NUM_BLOCKS)
    assert len(layout.parts) == 4 and layout.block_bytes == 4 * 4 * 2 * 8 * 4
    row = layout.pack([2])[0].numpy().tobytes()
    assert row == b"".join(caches[f"layers.{i}"][kv, 2].numpy().tobytes() for i in range(2) for kv in (0, 1))
    copy = {k: torch.zeros_like(v) for k, v in caches.items()}
    KvLayout.from_kv_caches(copy, NUM_BLOCKS).unpack([2], layout.pack([2]))
    assert all(torch.equal(copy[k][:, 2], v[:, 2]) for k, v in caches.items())


def test_no_block_dimension_is_refused() -> None:
    with pytest.raises(EngineError):
        KvLayout.from_kv_caches({"l.0": torch.zeros(3, 7)}, NUM_BLOCKS)


def test_wrong_input_size_is_refused() -> None:
    layout = KvLayout.from_kv_caches(_cpu_caches(), NUM_BLOCKS)
    with pytest.raises(ValueError):
        layout.unpack([1], torch.zeros((1, layout.block_bytes - 1), dtype=torch.uint8))
