"""vLLM KV events become our chained hashes: equal to hashing the prompt ourselves."""

from __future__ import annotations

import importlib.util

import pytest

from common.hashing import block_hashes
from common.protocol import AllCleared, BlockRemoved, BlockStored
from services.worker.engines.vllm.kv_events import VllmKvEvents

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")


def _stored(hashes, parent, tokens, block_size=4, lora_name=None):
    from vllm.distributed.kv_events import BlockStored as VllmStored

    return VllmStored(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens, block_size=block_size,
                      lora_id=None if lora_name is None else 1, medium="GPU", lora_name=lora_name)


def test_an_adapters_blocks_hash_under_the_adapters_seed() -> None:
    from common.hashing import adapter_seed

    tokens = list(range(100, 108))
    events = VllmKvEvents("ipc:///unused", block_size=4, seed=7)
    events.translate(_stored([b"a", b"b"], None, tokens, lora_name="sql"))
    events.translate(_stored([b"c", b"d"], None, tokens))  # the same tokens on the base model
    assert events.drain() == [
        BlockStored(block_hashes=tuple(block_hashes(tokens, 4, adapter_seed(7, "sql"))), parent_hash=None,
                    tier="device"),
        BlockStored(block_hashes=tuple(block_hashes(tokens, 4, 7)), parent_hash=None, tier="device"),
    ]


def test_stored_blocks_chain_onto_their_parent() -> None:
    from vllm.distributed.kv_events import AllBlocksCleared
    from vllm.distributed.kv_events import BlockRemoved as VllmRemoved

    tokens = list(range(100, 116))  # 4 blocks of 4
    expected = block_hashes(tokens, 4, seed=7)
    events = VllmKvEvents("ipc:///unused", block_size=4, seed=7)
    events.translate(_stored([b"a", b"b"], None, tokens[:8]))
    events.translate(_stored([b"c", b"d"], b"b", tokens[8:]))
    events.translate(_stored([b"z"], b"missing-parent", [1, 2, 3, 4]))  # cannot be named: skipped
    assert events.drain() == [
        BlockStored(block_hashes=tuple(expected[:2]), parent_hash=None, tier="device"),
        BlockStored(block_hashes=tuple(expected[2:]), parent_hash=expected[1], tier="device"),
    ]
    assert sorted(events.snapshot()) == sorted(expected)
    events.translate(VllmRemoved(block_hashes=[b"d", b"unknown"], medium="GPU"))
    events.translate(AllBlocksCleared())
    assert events.drain() == [BlockRemoved(block_hashes=(expected[3],), tier="device"), AllCleared(tier="device")]
    assert events.snapshot() == ()
