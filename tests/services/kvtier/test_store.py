"""BlockStore: host pool + disk tier round trips (through NIXL's POSIX backend and the os fallback),
checksums refusing bad input and catching a corrupted disk block."""

from __future__ import annotations

import importlib.util
import itertools
import os

import pytest

from common.kvtier.transfer import InlineTransfer, checksum
from common.nixl import make_nixl_agent
from common.protocol import TierBlock
from services.kvtier.store import BlockStore

BLOCK = 4096
_names = itertools.count()


def _payload(h: int, size: int = BLOCK) -> bytes:
    return bytes((h * 7 + i) % 251 for i in range(size))


def _blocks(*hashes: int) -> tuple[TierBlock, ...]:
    return InlineTransfer.pack([(h, _payload(h)) for h in hashes])


@pytest.fixture(scope="module")
def nixl():
    if importlib.util.find_spec("nixl") is None:
        pytest.skip("nixl is not installed (make setup installs it)")
    # Installed but unusable is a failure with its reason, never a skip.
    return make_nixl_agent(f"test-kvtier-{os.getpid()}-{next(_names)}", required=True)


@pytest.mark.parametrize("io", ["nixl", "os"])
def test_round_trip_host_and_disk(tmp_path, request, io) -> None:
    nixl = request.getfixturevalue("nixl") if io == "nixl" else None
    store = BlockStore("t", host_bytes=2 * BLOCK, block_bytes=BLOCK, disk_bytes=4 * BLOCK, disk_dir=tmp_path,
                       disk_min_hits=1, nixl=nixl, disk_prefer_nixl=io == "nixl")
    try:
        assert store.disk is not None and store.disk.io_mode == io
        assert store.pool.registered == (io == "nixl")
        assert store.store(_blocks(1, 2)) == (2, 0, 0)
        assert [b.block_hash for b in store.lookup([1, 2])] == [1, 2]  # both hit once: they earn disk
        assert store.store(_blocks(3, 4)) == (2, 0, 0)  # host full: 1 and 2 demoted to disk
        assert store.index.hashes("disk") == [1, 2]
        out = store.lookup([1, 2, 3, 4, 5])
        assert [(b.block_hash, b.tier) for b in out] == [(1, "disk"), (2, "disk"), (3, "host"), (4, "host")]
        for b in out:
            assert b.data == _payload(b.block_hash) and b.checksum == checksum(b.data) and b.size == BLOCK
        assert store.store(_blocks(1)) == (0, 1, 0)
    finally:
        store.close()


@pytest.mark.parametrize("io", ["nixl", "os"])
def test_corrupted_disk_block_is_detected_and_dropped(tmp_path, request, io) -> None:
    nixl = request.getfixturevalue("nixl") if io == "nixl" else None
    store = BlockStore("c", host_bytes=BLOCK, block_bytes=BLOCK, disk_bytes=4 * BLOCK, disk_dir=tmp_path,
                       disk_min_hits=0, nixl=nixl, disk_prefer_nixl=io == "nixl")
    try:
        store.store(_blocks(1, 2, 3))  # 1 and 2 go to disk slots 0 and 1; 3 stays on host
        assert store.index.get(2).tier == "disk"
        slot = store.index.get(2).slot
        with open(store.disk.path, "r+b") as f:  # flip one byte of block 2 on "NVMe"
            f.seek(slot * BLOCK + 100)
            byte = f.read(1)
            f.seek(slot * BLOCK + 100)
            f.write(bytes([byte[0] ^ 0xFF]))
        store.index.drain_events()
        out = store.lookup([1, 2, 3])
        assert [b.block_hash for b in out] == [1]  # the run ends at the corrupt block: never served
        assert store.num_checksum_failures == 1
        assert 2 not in store.index
        events = store.index.drain_events()
        assert any(getattr(e, "tier", "") == "disk" and 2 in getattr(e, "block_hashes", ()) for e in events)
    finally:
        store.close()


def test_bad_input_is_refused(tmp_path) -> None:
    store = BlockStore("r", host_bytes=4 * BLOCK, block_bytes=BLOCK)
    good = _blocks(1)[0]
    wrong_sum = TierBlock(block_hash=2, checksum=good.checksum, size=BLOCK, data=_payload(2))
    wrong_size = TierBlock(block_hash=3, checksum=checksum(b"x" * 10), size=11, data=b"x" * 10)
    too_big = InlineTransfer.pack([(4, b"y" * (BLOCK + 1))])[0]
    assert store.store((good, wrong_sum, wrong_size, too_big)) == (1, 0, 3)
    assert len(store.index) == 1
    store.close()


def test_lookup_caps() -> None:
    store = BlockStore("m", host_bytes=8 * BLOCK, block_bytes=BLOCK)
    store.store(_blocks(*range(1, 7)))
    assert len(store.lookup(list(range(1, 7)), max_blocks=4)) == 4
    assert len(store.lookup(list(range(1, 7)), max_bytes=3 * BLOCK)) == 3
    store.close()


def test_lookup_slots_hands_out_host_slots_and_disk_bytes(tmp_path) -> None:
    store = BlockStore("s", host_bytes=2 * BLOCK, block_bytes=BLOCK, disk_bytes=4 * BLOCK, disk_dir=tmp_path,
                       disk_min_hits=0)
    try:
        store.store(_blocks(1, 2, 3))  # 1 -> disk; 2, 3 on host slots 1, 0
        out, truncated = store.lookup_slots([1, 2, 3, 9])
        assert [(b.block_hash, b.tier, b.slot, len(b.data)) for b in out] == [
            (1, "disk", -1, BLOCK), (2, "host", store.index.get(2).slot, 0), (3, "host", store.index.get(3).slot, 0)]
        assert not truncated and all(b.checksum == checksum(_payload(b.block_hash)) for b in out)
        assert store.pool.read(out[1].slot, BLOCK) == _payload(2)
        assert (store.index.counters.hits_host, store.index.counters.hits_disk) == (2, 1)
        # Caps: inline (disk) bytes and block count; the rest is asked for again.
        store.store(_blocks(4))  # host full: 2 (LRU) -> disk
        out, truncated = store.lookup_slots([1, 2, 3, 4], max_inline_bytes=BLOCK)
        assert [b.block_hash for b in out] == [1] and truncated
        out, truncated = store.lookup_slots([3, 4, 9], max_blocks=1)
        assert [b.block_hash for b in out] == [3] and truncated
        out, truncated = store.lookup_slots([9, 3])
        assert out == [] and not truncated and store.index.counters.misses == 1
    finally:
        store.close()


def test_lookup_slots_reads_disk_blocks_into_bounce_slots(tmp_path, nixl) -> None:
    store = BlockStore("b", host_bytes=2 * BLOCK, block_bytes=BLOCK, disk_bytes=4 * BLOCK, disk_dir=tmp_path,
                       disk_min_hits=0, nixl=nixl, num_bounce=2)
    try:
        assert store.pool.registered and (store.pool.num_slots, store.pool.total_slots) == (2, 4)
        store.store(_blocks(1, 2, 3, 4))  # 1, 2 -> disk; 3, 4 on host
        out, truncated = store.lookup_slots([1, 2, 3, 4])
        assert [(b.block_hash, b.tier, b.slot, b.data) for b in out] == [
            (1, "disk", 2, b""), (2, "disk", 3, b""), (3, "host", store.index.get(3).slot, b""),
            (4, "host", store.index.get(4).slot, b"")]
        assert not truncated
        assert store.pool.read(2, BLOCK) == _payload(1) and store.pool.read(3, BLOCK) == _payload(2)
        store.store(_blocks(5, 6))  # 3, 4 -> disk as well: 4 disk blocks, 2 bounce slots
        out, truncated = store.lookup_slots([1, 2, 3, 4])
        assert [b.block_hash for b in out] == [1, 2] and truncated  # READ these, then ask for the rest
        out, _ = store.lookup_slots([3, 4])
        assert [b.slot for b in out] == [2, 3] and store.pool.read(2, BLOCK) == _payload(3)
    finally:
        store.close()
