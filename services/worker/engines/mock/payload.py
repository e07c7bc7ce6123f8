"""Deterministic stand-in KV bytes for the mock engine's blocks (it computes no real KV).

``fake_kv_payload(hash, n)`` is a pure function of the block hash, so a block offloaded by one worker and
onboarded by another can be checked byte for byte: real sizes, real checksums, and a wrong block is
detected exactly as it would be with real KV.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

_MUL = np.uint64(0x9E3779B97F4A7C15)


def fake_kv_payload(block_hash: int, num_bytes: int) -> bytes:
    """``num_bytes`` bytes derived from ``block_hash`` (u64 words: (i + 1) * golden ^ hash)."""
    words = (np.arange(1, num_bytes // 8 + 2, dtype=np.uint64) * _MUL) ^ np.uint64(block_hash)
    return words.view(np.uint8)[:num_bytes].tobytes()


@lru_cache(maxsize=4096)
def fake_kv_checksum(block_hash: int, num_bytes: int) -> int:
    import xxhash

    return xxhash.xxh3_64_intdigest(fake_kv_payload(block_hash, num_bytes))
