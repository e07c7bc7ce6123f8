"""Which blocks kvtier sends back a client accepts (hash, size, inline bytes, or a pool slot under NIXL)."""

from __future__ import annotations

import pytest

from common.kvtier.transfer import InlineTransfer, block_ok, checksum
from common.protocol import TierBlock

DATA = b"k" * 64
GOOD = TierBlock(block_hash=7, checksum=checksum(DATA), size=64, data=DATA)
SLOT = TierBlock(block_hash=7, checksum=checksum(DATA), size=64, slot=3)  # bytes to READ from slot 3


@pytest.mark.parametrize(("block", "expected_hash", "block_bytes", "slot_ok", "ok"), [
    (GOOD, 7, None, False, True),
    (GOOD, 8, None, False, False),  # not the block asked for
    (GOOD, 7, 64, False, True),
    (GOOD, 7, 128, False, False),  # another block size than the caller's cache
    (TierBlock(block_hash=7, checksum=checksum(DATA), size=64, data=DATA[:32]), 7, None, False, False),  # short
    (TierBlock(block_hash=7, checksum=checksum(DATA) ^ 1, size=64, data=DATA), 7, 64, False, False),  # corrupt
    (SLOT, 7, 64, True, True),
    (SLOT, 7, 64, False, False),  # no bytes, and slots not expected
    (SLOT, 7, 32, True, False),
    (TierBlock(block_hash=7, checksum=checksum(DATA), size=64, data=DATA, slot=3), 7, 64, True, True),
])
def test_block_ok(block: TierBlock, expected_hash: int, block_bytes: int | None, slot_ok: bool, ok: bool) -> None:
    assert block_ok(block, expected_hash, block_bytes, slot_ok) is ok


def test_incoming_refuses_bytes_that_do_not_match_size_or_checksum() -> None:
    assert InlineTransfer.incoming(GOOD) == DATA
    assert InlineTransfer.incoming(TierBlock(block_hash=7, checksum=GOOD.checksum, size=63, data=DATA)) is None
    assert InlineTransfer.incoming(TierBlock(block_hash=7, checksum=GOOD.checksum ^ 1, size=64, data=DATA)) is None
