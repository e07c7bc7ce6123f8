"""The mock engine's sampling controls: logit_bias, min_tokens, logprobs honoured; the rest refused."""

from __future__ import annotations

import math

import pytest

from common.errors import EngineError
from common.protocol import Handoff, SamplingParams, StructuredOutput
from services.worker.engine import EngineRequest
from services.worker.engines.mock.config import MockEngineConfig
from services.worker.engines.mock.engine import MockEngine
from services.worker.engines.mock.sampling import check_supported, next_token
from services.worker.engines.mock.tokens import next_token_id
from tests.services.worker.engines.mock.test_engine import (
    PROMPT,
    _collect,
    _config,
    _tokens,
)

CONFIG = MockEngineConfig(vocab_size=1000)
SEQ = (5, 6, 7, 8)


def test_without_controls_the_hashed_token_wins() -> None:
    assert next_token(SEQ, 0, SamplingParams(seed=3), CONFIG) == (next_token_id(SEQ, 3, CONFIG), None)


@pytest.mark.parametrize(("bias", "expected"), [
    ({42: 100.0}, 42),  # a large bias beats the hashed token
    ({42: 5.0}, None),  # a small one does not (None: the hashed token)
    ({42: 100.0, 43: 100.0}, 42),  # ties go to the lower id
])
def test_logit_bias(bias: dict[int, float], expected: int | None) -> None:
    hashed = next_token_id(SEQ, None, CONFIG)
    token, _ = next_token(SEQ, 0, SamplingParams(logit_bias=bias), CONFIG)
    assert token == (hashed if expected is None else expected)


def test_a_banned_hashed_token_is_replaced() -> None:
    hashed = next_token_id(SEQ, None, CONFIG)
    token, _ = next_token(SEQ, 0, SamplingParams(logit_bias={hashed: -100.0}), CONFIG)
    assert token != hashed and 0 <= token < CONFIG.vocab_size


def test_min_tokens_masks_stop_ids_until_reached() -> None:
    hashed = next_token_id(SEQ, None, CONFIG)
    sampling = SamplingParams(stop_token_ids=(hashed,), min_tokens=2)
    assert next_token(SEQ, 1, sampling, CONFIG)[0] != hashed
    assert next_token(SEQ, 2, sampling, CONFIG)[0] == hashed
    # A stop id biased up is masked too.
    biased = SamplingParams(stop_token_ids=(9,), logit_bias={9: 100.0}, min_tokens=1)
    assert next_token(SEQ, 0, biased, CONFIG)[0] != 9


def test_logprobs_are_a_sorted_distribution() -> None:
    token, lp = next_token(SEQ, 0, SamplingParams(logprobs=5, logit_bias={3: 2.0}), CONFIG)
    assert lp is not None and lp.token_id == token
    values = [v for _, v in lp.top]
    assert len(lp.top) == 5 and values == sorted(values, reverse=True) and all(math.isfinite(v) for v in values)
    assert lp.top[0] == (token, lp.logprob) and lp.top[1][0] == 3
    assert lp.logprob < 0 and len({t for t, _ in lp.top}) == 5
    assert next_token(SEQ, 0, SamplingParams(logprobs=0), CONFIG)[1].top == ()  # type: ignore[union-attr]


@pytest.mark.parametrize("sampling", [
    SamplingParams(presence_penalty=0.5), SamplingParams(frequency_penalty=-1.0),
    SamplingParams(repetition_penalty=1.2), SamplingParams(structured=StructuredOutput(json_object=True)),
    SamplingParams(structured=StructuredOutput(regex="a+")), SamplingParams(allowed_token_ids=(1, 2)),
    SamplingParams(bad_words_token_ids=((3,),)), SamplingParams(prompt_logprobs=0)])
def test_refuses_what_it_cannot_honour(sampling: SamplingParams) -> None:
    with pytest.raises(EngineError, match="does not support"):
        check_supported("r", sampling)


async def test_disaggregated_equals_aggregated_under_controls() -> None:
    # logit_bias, min_tokens + stop ids and logprobs on the prefill and the decode side alike.
    plain = MockEngine(_config())
    await plain.start()
    free = _tokens(await _collect(plain, EngineRequest("free", PROMPT, SamplingParams(max_tokens=8, seed=1))))
    await plain.shutdown()
    sampling = SamplingParams(max_tokens=8, seed=1, logit_bias={free[2]: 100.0}, logprobs=2,
                              stop_token_ids=(free[2],), min_tokens=4)
    engines = [MockEngine(_config(engine_id=name)) for name in ("agg", "prefill", "decode")]
    for eng in engines:
        await eng.start()
    agg, prefill, decode = engines
    whole = await _collect(agg, EngineRequest("a", PROMPT, sampling))
    first = await _collect(prefill, EngineRequest("p", PROMPT, sampling, prefill_only=True))
    # The hand-off carries the request as sent (its whole budget and min_tokens) and the first token.
    rest = await _collect(decode, EngineRequest("d", PROMPT, sampling,
                                                handoff=Handoff(first[0].token_ids[0], first[0].kv_transfer)))
    tokens = _tokens(whole)
    # The biased stop id wins every step once min_tokens (4) is reached: the 5th token stops the request.
    assert len(tokens) == 5 and tokens[-1] == free[2] and whole[-1].finish_reason == "stop"
    assert free[2] not in tokens[:4]
    assert list(first[0].token_ids) + _tokens(rest) == tokens
    logprobs = [lp for out in (*first, *rest) for lp in out.logprobs]
    assert logprobs == [lp for out in whole for lp in out.logprobs] and len(logprobs) == 5
    for eng in engines:
        await eng.shutdown()


async def test_the_engine_refuses_penalties() -> None:
    eng = MockEngine(_config())
    await eng.start()
    with pytest.raises(EngineError, match="presence_penalty"):
        await _collect(eng, EngineRequest("x", PROMPT, SamplingParams(presence_penalty=1.0)))
    await eng.shutdown()
