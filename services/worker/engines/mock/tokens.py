"""The mock engine's next token: a pure function of the sequence so far and the request's seed, so a
disaggregated run (prefill worker makes token 1, decode worker continues from prompt + token 1) yields the
same tokens as an aggregated one."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from functools import lru_cache

import xxhash

from services.worker.engines.mock.config import MockEngineConfig

# Tokens of context the next-token function looks at (with the position, so short cycles are rare).
_CONTEXT_TOKENS = 8


def next_token_id(token_ids: Sequence[int], seed: int | None, config: MockEngineConfig) -> int:
    """The token that follows ``token_ids``: a hash of its tail and length, in [0, vocab_size)."""
    tail = token_ids[-_CONTEXT_TOKENS:]
    data = struct.pack(f"<{len(tail) + 1}Q", len(token_ids), *tail)
    digest = xxhash.xxh3_64_intdigest(data, seed or 0)
    if config.emit_eos:
        return digest % config.vocab_size
    excluded = _excluded_ids(config.eos_token_id, config.other_eos_token_ids, config.vocab_size)
    token_id = digest % (config.vocab_size - len(excluded))
    for eos in excluded:  # ascending: shift past each excluded id at or below the candidate
        if token_id >= eos:
            token_id += 1
    return token_id


@lru_cache(maxsize=8)
def _excluded_ids(eos: int, others: tuple[int, ...], vocab_size: int) -> tuple[int, ...]:
    return tuple(sorted({t for t in (eos, *others) if 0 <= t < vocab_size}))
