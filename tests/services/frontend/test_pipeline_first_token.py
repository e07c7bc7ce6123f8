"""When a remotely prefilled request's first token reaches the client (PipelineConfig.first_token): with the decode
worker's first output ("decode", the default) or as soon as the prefill worker has it ("prefill").

The pipeline's own request path (``Pipeline._run``) with its two worker calls replaced: the order in which the
first token, the decode request and the decode worker's output happen is the behaviour under test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from common.errors import WorkerLost
from common.protocol import Generate, Route, SamplingParams, Tokens, WorkerRef
from services.frontend.metrics import FrontendMetrics
from services.frontend.pipeline import Pipeline, PipelineConfig, _Prefilled

ROUTE = Route(request_id="r", decode=WorkerRef("d0", "tcp://127.0.0.1:1"), prefill=WorkerRef("p0", "tcp://127.0.0.1:2"))


def _pipeline(first_token: str, events: list, decode_fails: bool = False, forced_step: bool = False) -> Pipeline:
    pipeline = Pipeline.__new__(Pipeline)  # no sockets: both worker calls are replaced below
    pipeline.config = PipelineConfig(router_endpoint="tcp://127.0.0.1:1",
                                     first_token=first_token)  # type: ignore[arg-type]
    pipeline.metrics = FrontendMetrics()

    async def prefill(request_id: str, prompt: tuple[int, ...], sampling: SamplingParams,
                      route: Route, lora_name: str = "") -> _Prefilled:
        return _Prefilled(first_token_id=7, kv_transfer=None, finish_reason=None, num_cached_tokens=0)

    async def stream(client: object, msg: Generate, idle_timeout_s: float | None = None) -> AsyncIterator[Tokens]:
        events.append(("decode_sent", msg.token_ids))
        if decode_fails:
            raise WorkerLost("decode worker gone")
        if forced_step:  # a vLLM decode worker: its engine's first step re-made the first token, sent empty
            yield Tokens(request_id=msg.request_id, token_ids=())
            events.append("next_step")
        yield Tokens(request_id=msg.request_id, token_ids=(8,))
        yield Tokens(request_id=msg.request_id, token_ids=(9,), finish_reason="length")

    pipeline._prefill = prefill  # type: ignore[method-assign]
    pipeline._stream = stream  # type: ignore[method-assign]
    pipeline._client = lambda endpoint: None  # type: ignore[method-assign,assignment,return-value]
    return pipeline


async def _events(first_token: str, decode_fails: bool = False, forced_step: bool = False) -> list:
    events: list = []
    pipeline = _pipeline(first_token, events, decode_fails, forced_step)
    try:
        async for out in pipeline._run("r", (1, 2, 3), SamplingParams(max_tokens=3), ROUTE):
            events.append(out.token_ids)
    except WorkerLost:
        events.append("lost")
    return events


@pytest.mark.parametrize(("first_token", "expected"), [
    # The first token leaves with the decode worker's first output: no hand-off gap between them in the stream.
    ("decode", [("decode_sent", (1, 2, 3)), (7,), (8,), (9,)]),
    # The first token leaves before the decode request is even sent.
    ("prefill", [(7,), ("decode_sent", (1, 2, 3)), (8,), (9,)]),
])
async def test_first_token_order(first_token: str, expected: list) -> None:
    assert await _events(first_token) == expected


async def test_held_first_token_is_not_sent_when_the_decode_worker_is_lost() -> None:
    # The caller migrates a request with nothing streamed from its prompt alone: prefilled again, the same answer.
    assert await _events("decode", decode_fails=True) == [("decode_sent", (1, 2, 3)), "lost"]


@pytest.mark.parametrize(("first_token", "expected"), [
    # The empty output of the decode engine's first step releases the held token; it is not passed on itself.
    ("decode", [("decode_sent", (1, 2, 3)), (7,), "next_step", (8,), (9,)]),
    ("prefill", [(7,), ("decode_sent", (1, 2, 3)), "next_step", (8,), (9,)]),
])
async def test_the_decode_engines_first_step_releases_the_first_token(first_token: str, expected: list) -> None:
    assert await _events(first_token, forced_step=True) == expected
