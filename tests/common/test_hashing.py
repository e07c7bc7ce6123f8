"""The block-hash contract (docs/architecture.md#contracts): pinned values, the documented byte layout, chaining, seeds."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest
import xxhash

from common.hashing import block_hashes, extend_block_hashes, hash_seed


def _reference(tokens: list[int], block_size: int, seed: int) -> list[int]:
    """The contract written the slow, obvious way, from the docstring's byte layout."""
    out: list[int] = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        raw = b"".join(t.to_bytes(4, "little") for t in tokens[start : start + block_size])
        local = xxhash.xxh3_64_intdigest(raw, seed)
        if not out:
            out.append(local)
        else:
            pair = out[-1].to_bytes(8, "little") + local.to_bytes(8, "little")
            out.append(xxhash.xxh3_64_intdigest(pair, seed))
    return out


# Pinned once; a change here breaks every cache in a mixed-version deployment.
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("m",), 5996342643462224776),
        (("tiny-llama",), 8931827653188164533),
        (("tiny-llama", "", ""), 8931827653188164533),
        (("a", "b", "c"), 2951861010799122738),
        (("",), 14166511957577999600),
    ],
)
def test_hash_seed_pinned(args: tuple[str, ...], expected: int) -> None:
    assert hash_seed(*args) == expected


def test_hash_seed_layout_and_separation() -> None:
    payload = b"".join(struct.pack("<I", len(p)) + p for p in (b"a", b"b", b"c"))
    assert hash_seed("a", "b", "c") == xxhash.xxh3_64_intdigest(payload, 0)
    # Length prefixes keep shifted boundaries apart.
    assert hash_seed("ab", "c") != hash_seed("a", "bc")
    assert hash_seed("m", "lora") != hash_seed("m", "", "lora")


@pytest.mark.parametrize(
    ("tokens", "block_size", "seed", "expected"),
    [
        (list(range(40)), 16, 8931827653188164533, [13431961329906836484, 17403949859339909490]),
        (list(range(40)), 16, 0, [8773583392624668237, 14571380008329203442]),
        (list(range(8)), 4, 0, [11660027832386793900, 15795048925959984383]),
    ],
)
def test_block_hashes_pinned(tokens: list[int], block_size: int, seed: int, expected: list[int]) -> None:
    assert block_hashes(tokens, block_size, seed) == expected


@pytest.mark.parametrize("block_size", [1, 3, 16, 64])
def test_matches_reference_layout(block_size: int) -> None:
    rng = random.Random(block_size)
    tokens = [rng.randrange(2**32) for _ in range(300)]
    seed = rng.getrandbits(64)
    assert block_hashes(tokens, block_size, seed) == _reference(tokens, block_size, seed)


def test_prefix_of_hashes_is_hashes_of_prefix() -> None:
    rng = random.Random(1)
    tokens = [rng.randrange(50_000) for _ in range(1_000)]
    full = block_hashes(tokens, 16, 7)
    for n_tokens in (0, 15, 16, 17, 160, 999):
        assert block_hashes(tokens[:n_tokens], 16, 7) == full[: n_tokens // 16]


def test_partial_block_ignored() -> None:
    assert block_hashes(list(range(15)), 16, 0) == []
    assert block_hashes(list(range(31)), 16, 0) == block_hashes(list(range(16)), 16, 0)
    assert block_hashes(list(range(16)) + [1], 16, 0) == block_hashes(list(range(16)) + [2], 16, 0)


def test_chain_depends_on_everything_before() -> None:
    a = list(range(64))
    b = [99] + a[1:]  # differs only in the first block
    ha, hb = block_hashes(a, 16, 0), block_hashes(b, 16, 0)
    assert all(x != y for x, y in zip(ha, hb, strict=True))
    # The same block content after different prefixes hashes differently.
    assert block_hashes(a[:16] * 2, 16, 0)[1] != block_hashes(a[:16], 16, 0)[0]


def test_seed_changes_everything() -> None:
    tokens = list(range(64))
    h0, h1 = block_hashes(tokens, 16, 0), block_hashes(tokens, 16, 1)
    assert all(x != y for x, y in zip(h0, h1, strict=True))


def test_input_types_agree() -> None:
    tokens = list(range(100, 200))
    expected = block_hashes(tokens, 8, 3)
    assert block_hashes(tuple(tokens), 8, 3) == expected
    assert block_hashes(np.asarray(tokens, dtype=np.int64), 8, 3) == expected


def test_extend_equals_full() -> None:
    rng = random.Random(2)
    tokens = [rng.randrange(50_000) for _ in range(200)]
    full = block_hashes(tokens, 16, 5)
    for n_prev in range(len(full) + 1):
        assert extend_block_hashes(full[:n_prev], tokens, 16, 5) == full
    assert extend_block_hashes([], tokens, 16, 5) == full


def test_extend_rejects_too_many_previous() -> None:
    with pytest.raises(ValueError):
        extend_block_hashes([1, 2], list(range(20)), 16, 0)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError):
        block_hashes([1, 2], 0, 0)
    with pytest.raises(struct.error):
        block_hashes([-1] * 16, 16, 0)
    with pytest.raises(struct.error):
        block_hashes([2**32] * 16, 16, 0)


def test_values_are_u64() -> None:
    rng = random.Random(3)
    tokens = [rng.randrange(2**32) for _ in range(16 * 50)]
    assert all(0 <= h < 2**64 for h in block_hashes(tokens, 16, 2**64 - 1))


def test_adapter_seed_separates_adapters_from_each_other_and_from_the_base_model() -> None:
    from common.hashing import adapter_seed

    base = hash_seed("tiny")
    assert adapter_seed(base, "") == base
    seeds = {base, adapter_seed(base, "a"), adapter_seed(base, "b"), adapter_seed(hash_seed("other"), "a")}
    assert len(seeds) == 4
    assert adapter_seed(base, "a") == hash_seed(f"{base:x}", "a")  # the documented bytes
    tokens = list(range(64))
    assert block_hashes(tokens, 32, base) != block_hashes(tokens, 32, adapter_seed(base, "a"))
