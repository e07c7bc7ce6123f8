"""The mock engine's admission: token ids must fit the u32 the block hashes pack them as."""

from __future__ import annotations

import pytest

from common.errors import EngineError
from common.protocol import SamplingParams
from services.worker.engine import EngineRequest
from services.worker.engines.mock.admission import seq_spec
from services.worker.engines.mock.block_manager import BlockManager


@pytest.mark.parametrize(("token_ids", "ok"), [
    ((0, 1, 2**32 - 1), True),
    ((5, -1, 7), False),
    ((5, 2**32, 7), False),
    ((-(2**40),), False),
])
def test_token_ids_outside_u32_are_refused(token_ids: tuple[int, ...], ok: bool) -> None:
    request = EngineRequest(request_id="r", token_ids=token_ids, sampling=SamplingParams(max_tokens=2))
    blocks = BlockManager(num_blocks=8, block_size=4)
    if ok:
        assert seq_spec(request, 64, blocks).token_ids == token_ids
    else:
        with pytest.raises(EngineError, match="outside u32"):
            seq_spec(request, 64, blocks)
