"""How one vLLM KV block becomes one kvtier block, and back: a fixed packing of every layer's K and V.

A tier block is the concatenation, in ``layer_names`` order (layer names sorted with their numbers compared as
numbers: ``layers.2`` before ``layers.10``), of each layer's slab for that block id:

* a layer tensor whose dim 0 is the block id (vLLM's CPU attention: ``[num_blocks, num_kv_heads, block_size,
  2 * head_size]``, K and V interleaved inside the block) contributes ``t[block_id]``;
* a layer tensor ``[2, num_blocks, ...]`` (K and V split, e.g. FlashAttention on GPUs) contributes
  ``t[0][block_id]`` then ``t[1][block_id]``.

Each slab is copied as its raw bytes (C order), so ``block_bytes`` = sum of slab sizes and is the same on every
worker of a model with the same dtype and block size: workers of one model can load each other's blocks.
No I/O here: ``pack`` gathers blocks into a ``[n, block_bytes]`` uint8 tensor, ``unpack`` scatters one back,
both on the KV cache's device (``mover.py`` moves them to and from host memory).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from common.errors import EngineError

_NUMBER = re.compile(r"(\d+)")


def layer_order(names: Sequence[str]) -> list[str]:
    """Names sorted with embedded numbers compared as integers (``layers.2`` < ``layers.10``)."""
    return sorted(names, key=lambda n: [int(p) if p.isdigit() else p for p in _NUMBER.split(n)])


@dataclass(frozen=True)
class KvLayout:
    layer_names: tuple[str, ...]
    # Views indexed by block id on dim 0, in packing order (one per layer, or K then V per layer).
    parts: tuple[torch.Tensor, ...]
    # Bytes of one block's slab in each part.
    part_bytes: tuple[int, ...]
    num_blocks: int

    @property
    def block_bytes(self) -> int:
        return sum(self.part_bytes)

    @property
    def device(self) -> torch.device:
        return self.parts[0].device if self.parts else torch.device("cpu")

    @classmethod
    def from_kv_caches(cls, kv_caches: Mapping[str, torch.Tensor], num_blocks: int) -> KvLayout:
        names = layer_order(list(kv_caches))
        parts: list[torch.Tensor] = []
        for name in names:
            t = kv_caches[name]
            if t.dim() >= 2 and t.shape[0] == num_blocks:
                layer_parts = [t]
            elif t.dim() >= 3 and t.shape[0] == 2 and t.shape[1] == num_blocks:
                layer_parts = [t[0], t[1]]
            else:
                raise EngineError(f"KV cache of {name} has shape {tuple(t.shape)}: no block dimension of "
                                  f"{num_blocks} blocks found")
            for part in layer_parts:
                if not part[0].is_contiguous():
                    raise EngineError(f"KV cache of {name}: one block's slab is not contiguous "
                                      f"(strides {part.stride()})")
            parts += layer_parts
        part_bytes = tuple(p[0].numel() * p.element_size() for p in parts)
        return cls(tuple(names), tuple(parts), part_bytes, num_blocks)

    def pack(self, block_ids: Sequence[int]) -> torch.Tensor:
        """``[len(block_ids), block_bytes]`` uint8: row i is the tier block of ``block_ids[i]``."""
        n = len(block_ids)
        out = torch.empty((n, self.block_bytes), dtype=torch.uint8, device=self.device)
        if not n:
            return out
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        offset = 0
        for part, size in zip(self.parts, self.part_bytes):
            slabs = part.index_select(0, idx).reshape(n, -1)  # a copy: [n, elements per slab]
            out[:, offset:offset + size] = slabs.view(torch.uint8)
            offset += size
        return out

    def unpack(self, block_ids: Sequence[int], blocks: torch.Tensor) -> None:
        """Write ``blocks`` (``[len(block_ids), block_bytes]`` uint8 on the KV cache's device, as ``pack`` makes
        them) into the KV cache."""
        n = len(block_ids)
        if blocks.shape != (n, self.block_bytes) or blocks.dtype != torch.uint8:
            raise ValueError(f"expected uint8 [{n}, {self.block_bytes}], got {blocks.dtype} {tuple(blocks.shape)}")
        if not n:
            return
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        offset = 0
        for part, size in zip(self.parts, self.part_bytes):
            raw = blocks[:, offset:offset + size].contiguous()
            part.index_copy_(0, idx, raw.view(part.dtype).reshape((n, *part.shape[1:])))
            offset += size
