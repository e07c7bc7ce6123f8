"""kvtier trusts no writer: it keeps its own checksum of what it stores, keeps blocks per model, never rewrites a
held block, and every load (inline or a NIXL slot) is checked against its checksum."""

from __future__ import annotations

import msgspec

from common.kvtier.transfer import InlineTransfer, block_ok, checksum
from common.protocol import TierBlock, TierLookup, TierStore, TierBlocks, TierStored
from services.kvtier.service import KvTierConfig, KvTierService
from services.kvtier.store import BlockStore

BLOCK = 1024
MODEL_A, MODEL_B = 0xA, 0xB


def _payload(h: int, fill: int = 0) -> bytes:
    return bytes((h * 7 + i + fill) % 251 for i in range(BLOCK))


def _store() -> BlockStore:
    return BlockStore("t", host_bytes=8 * BLOCK, block_bytes=BLOCK)


def test_a_block_whose_checksum_is_not_of_its_bytes_is_refused() -> None:
    store = _store()
    good = InlineTransfer.pack([(1, _payload(1))])[0]
    # The checksum of other bytes (a writer claiming one content and sending another), and a wrong size.
    lying = msgspec.structs.replace(good, data=_payload(1, fill=1))
    short = msgspec.structs.replace(good, size=BLOCK - 1)
    assert store.store([lying, short], MODEL_A) == (0, 0, 2)
    assert store.lookup([1], model_id=MODEL_A) == []


def test_the_recorded_checksum_is_computed_here_and_a_held_block_is_never_rewritten() -> None:
    store = _store()
    store.store(InlineTransfer.pack([(1, _payload(1))]), MODEL_A)
    # Another writer sends other bytes (with their own matching checksum) under the same hash: present, ignored.
    assert store.store(InlineTransfer.pack([(1, _payload(1, fill=9))]), MODEL_A) == (0, 1, 0)
    [served] = store.lookup([1], model_id=MODEL_A)
    assert served.data == _payload(1) and served.checksum == checksum(_payload(1))
    assert store.index.get(1).checksum == checksum(_payload(1))


def test_blocks_are_kept_per_model() -> None:
    store = _store()
    store.store(InlineTransfer.pack([(1, _payload(1)), (2, _payload(2))]), MODEL_A)
    assert store.lookup([1, 2], model_id=MODEL_B) == []  # another model's lookup: a miss
    assert store.index.peek([1, 2], model_id=MODEL_B) == []
    assert store.lookup_slots([1, 2], model_id=MODEL_B) == ([], False)
    # A store of the same hash for another model is refused, and model A's block stays.
    assert store.store(InlineTransfer.pack([(1, _payload(1, fill=3))]), MODEL_B) == (0, 0, 1)
    assert [b.data for b in store.lookup([1, 2], model_id=MODEL_A)] == [_payload(1), _payload(2)]


def test_a_load_is_verified_against_the_tiers_checksum() -> None:
    store = _store()
    store.store(InlineTransfer.pack([(5, _payload(5))]), MODEL_A)
    [slot_block] = store.lookup_slots([5], model_id=MODEL_A)[0]  # a host slot: the worker READs it with NIXL
    assert slot_block.slot >= 0 and slot_block.checksum == checksum(_payload(5))
    [inline] = store.lookup([5], model_id=MODEL_A)
    assert block_ok(inline, 5, BLOCK)
    # Bytes changed on the way (or a slot overwritten before the READ): the worker's check refuses them.
    assert not block_ok(msgspec.structs.replace(inline, data=_payload(5, fill=1)), 5, BLOCK)


def test_the_service_namespaces_by_the_messages_model() -> None:
    svc = KvTierService(KvTierConfig(block_bytes=BLOCK, host_bytes=8 * BLOCK, nixl=False))
    svc.store = _store()
    stored = svc.handle(TierStore(request_id="s", worker_id="w", blocks=InlineTransfer.pack([(3, _payload(3))]),
                                  model_id=MODEL_A))
    assert stored == TierStored(request_id="s", num_stored=1)
    miss = svc.handle(TierLookup(request_id="l", block_hashes=(3,), model_id=MODEL_B))
    hit = svc.handle(TierLookup(request_id="l", block_hashes=(3,), model_id=MODEL_A))
    probe = svc.handle(TierLookup(request_id="p", block_hashes=(3,), with_data=False, model_id=MODEL_B))
    assert isinstance(miss, TierBlocks) and miss.blocks == () and isinstance(probe, TierBlocks) and probe.blocks == ()
    assert isinstance(hit, TierBlocks) and [b.data for b in hit.blocks] == [_payload(3)]
    assert isinstance(hit.blocks[0], TierBlock)
