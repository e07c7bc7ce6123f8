"""Logprobs in OpenAI's chat and completions shapes, as the official client parses them."""

from __future__ import annotations

import orjson
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from common.protocol import TokenLogprobs
from services.frontend.logprobs import LogprobsRenderer
from services.frontend.completion_bodies import ResponseShape

TEXT = {1: "Hel", 2: "lo", 3: " w", 4: "é"}
LOGPROBS = (TokenLogprobs(1, -0.5, ((1, -0.5), (3, -1.5))), TokenLogprobs(2, float("-inf"), ((4, -0.1), (2, -2.0))))
USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def test_chat_shape_whole_and_streamed() -> None:
    shape = ResponseShape.chat("chatcmpl-1", "m")
    renderer = LogprobsRenderer(TEXT.__getitem__, is_chat=True)
    parts = [renderer.render(LOGPROBS[:1]), renderer.render(LOGPROBS[1:])]
    whole = ChatCompletion.model_validate(orjson.loads(shape.full_response([("Hello", "stop",
                                                                            renderer.merge(parts))], USAGE)))
    content = whole.choices[0].logprobs.content
    assert [c.token for c in content] == ["Hel", "lo"] and content[0].bytes == list(b"Hel")
    assert content[1].logprob == -9999.0  # JSON has no -inf
    assert [t.token for t in content[1].top_logprobs] == ["é", "lo"]
    assert content[1].top_logprobs[0].bytes == list("é".encode())
    chunk = shape.delta_chunk("Hel", parts[0])
    assert chunk.startswith(b"data: ") and chunk.endswith(b"\n\n")
    streamed = ChatCompletionChunk.model_validate(orjson.loads(chunk[6:]))
    assert streamed.choices[0].delta.content == "Hel" and streamed.choices[0].logprobs.content[0].logprob == -0.5
    # Without logprobs the fast path is unchanged.
    plain = ChatCompletionChunk.model_validate(orjson.loads(shape.delta_chunk("x")[6:]))
    assert plain.choices[0].logprobs is None


def test_completion_shape_offsets_run_across_chunks() -> None:
    shape = ResponseShape.completion("cmpl-1", "m")
    renderer = LogprobsRenderer(TEXT.__getitem__, is_chat=False)
    parts = [renderer.render(LOGPROBS[:1]), renderer.render(LOGPROBS[1:])]
    merged = renderer.merge(parts)
    whole = Completion.model_validate(orjson.loads(shape.full_response([("Hello", "length", merged)], USAGE)))
    lp = whole.choices[0].logprobs
    assert lp.tokens == ["Hel", "lo"] and lp.token_logprobs == [-0.5, -9999.0]
    assert lp.top_logprobs == [{"Hel": -0.5, " w": -1.5}, {"é": -0.1, "lo": -2.0}]
    assert lp.text_offset == [0, 3]


def test_continuous_usage_rides_on_delta_chunks() -> None:
    shape = ResponseShape.chat("chatcmpl-1", "m")
    chunk = ChatCompletionChunk.model_validate(orjson.loads(shape.delta_chunk("x", None, 0, USAGE)[6:]))
    assert chunk.usage.completion_tokens == 2 and chunk.choices[0].delta.content == "x"


def test_continuous_usage_fast_path_is_the_generic_chunk_byte_for_byte() -> None:
    # The per-token bytes built from the request's constant head and tail equal the dict-encoded chunk (the
    # shape vLLM's server sends), for both endpoints, with text that JSON must escape.
    for shape, field in ((ResponseShape.chat("chatcmpl-1", "m"), {"delta": {"content": 'é"\n'}}),
                         (ResponseShape.completion("cmpl-1", "m"), {"text": 'é"\n'})):
        generic = shape._chunk([{"index": 0, **field, "logprobs": None, "finish_reason": None}], USAGE)
        assert shape.delta_chunk('é"\n', None, 0, USAGE) == generic
        assert orjson.loads(generic[6:])["usage"] == USAGE
