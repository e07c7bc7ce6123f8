"""Which queued output slices of one request a lagging reader takes as one (common/tokens_merge.py)."""

from __future__ import annotations

import pytest

from common.protocol import KvTransferParams, TokenLogprobs, Tokens
from common.tokens_merge import merged

LP1, LP2 = TokenLogprobs(token_id=1, logprob=-0.1), TokenLogprobs(token_id=2, logprob=-0.2)
KV = KvTransferParams(remote_engine_id="e", remote_block_ids=(1,), num_bytes=64)


@pytest.mark.parametrize(("first", "then", "joined"), [
    # decode slices: tokens (and logprobs) in order, the later one's finish
    (Tokens(request_id="r", token_ids=(1,), num_cached_tokens=16), Tokens(request_id="r", token_ids=(2,)),
     Tokens(request_id="r", token_ids=(1, 2), num_cached_tokens=16)),
    (Tokens(request_id="r", token_ids=(1,), logprobs=(LP1,)),
     Tokens(request_id="r", token_ids=(2,), finish_reason="length", logprobs=(LP2,)),
     Tokens(request_id="r", token_ids=(1, 2), finish_reason="length", logprobs=(LP1, LP2))),
    # the decode engine's empty first output (the hand-off done) and a failed pull's flag survive the join
    (Tokens(request_id="r", token_ids=(), transfer_failed=True), Tokens(request_id="r", token_ids=(5,)),
     Tokens(request_id="r", token_ids=(5,), transfer_failed=True)),
    # the first slice's prompt logprobs stay on it
    (Tokens(request_id="r", token_ids=(1,), prompt_logprobs=(LP1,)), Tokens(request_id="r", token_ids=(2,)),
     Tokens(request_id="r", token_ids=(1, 2), prompt_logprobs=(LP1,))),
    # kept apart: a finished slice, another request, a KV hand-off, something that is not a slice, logprobs
    # on one of two token-carrying slices only
    (Tokens(request_id="r", token_ids=(1,), finish_reason="stop"), Tokens(request_id="r", token_ids=(2,)), None),
    (Tokens(request_id="r", token_ids=(1,)), Tokens(request_id="q", token_ids=(2,)), None),
    (Tokens(request_id="r", token_ids=(1,)), Tokens(request_id="r", token_ids=(2,), kv_transfer=KV), None),
    (Tokens(request_id="r", token_ids=(1,), kv_transfer=KV), Tokens(request_id="r", token_ids=(2,)), None),
    (Tokens(request_id="r", token_ids=(1,)), object(), None),
    (Tokens(request_id="r", token_ids=(1,)), Tokens(request_id="r", token_ids=(2,), prompt_logprobs=(LP1,)), None),
    (Tokens(request_id="r", token_ids=(1,), logprobs=(LP1,)), Tokens(request_id="r", token_ids=(2,)), None),
])
def test_merged(first, then, joined) -> None:
    assert merged(first, then) == joined
