"""n choices: choice 0 takes the routed path; the others wait for its decode worker and go straight to it."""

from __future__ import annotations

import asyncio

from common.protocol import Route, SamplingParams, Tokens, WorkerRef
from services.frontend.choices import Choices

DECODE = WorkerRef(worker_id="decode-1", endpoint="tcp://d")


class FakePipeline:
    """Records each generate call; choice outputs are (seed, position) so choices are told apart."""

    def __init__(self, num_tokens: int = 3) -> None:
        self.calls: list[tuple[str, int | None, Route | None]] = []
        self.num_tokens = num_tokens

    async def generate(self, request_id, model, token_ids, sampling, route=None, on_decode=None, lora_name=""):
        self.calls.append((request_id, sampling.seed, route))
        for i in range(self.num_tokens):
            await asyncio.sleep(0)
            if i == 1 and on_decode is not None:
                on_decode(Route(request_id=request_id, decode=DECODE))
            last = i == self.num_tokens - 1
            yield Tokens(request_id=request_id, token_ids=((sampling.seed or 0) * 100 + i,),
                         finish_reason="length" if last else None)


async def collect(choices: Choices) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    async for index, tokens in choices:
        out.setdefault(index, []).extend(tokens.token_ids)
    return out


async def test_the_others_follow_choice_0_to_its_decode_worker() -> None:
    pipeline = FakePipeline()
    out = await collect(Choices(pipeline, "r", "m", (1, 2), SamplingParams(seed=5), 3))  # type: ignore[arg-type]
    assert out == {0: [500, 501, 502], 1: [600, 601, 602], 2: [700, 701, 702]}
    assert pipeline.calls[0] == ("r", 5, None)  # routed by the router
    pinned = {call[0]: call for call in pipeline.calls[1:]}
    assert set(pinned) == {"r-1", "r-2"}
    assert all(route is not None and route.decode == DECODE and route.prefill is None
               for _, _, route in pinned.values())


async def test_one_choice_is_the_plain_path_and_stop_ends_one_choice() -> None:
    pipeline = FakePipeline()
    assert await collect(Choices(pipeline, "r", "m", (1,), SamplingParams(), 1)) == {0: [0, 1, 2]}  # type: ignore[arg-type]
    assert pipeline.calls == [("r", None, None)]
    choices = Choices(FakePipeline(num_tokens=50), "r", "m", (1,), SamplingParams(seed=1), 2)  # type: ignore[arg-type]
    seen: dict[int, int] = {}
    async for index, _ in choices:
        seen[index] = seen.get(index, 0) + 1
        if index == 1 and seen[1] == 2:
            choices.stop(1)
    assert seen == {0: 50, 1: 2}


async def test_stop_ends_a_single_choice() -> None:
    choices = Choices(FakePipeline(num_tokens=50), "r", "m", (1,), SamplingParams(), 1)  # type: ignore[arg-type]
    seen = 0
    async for _ in choices:
        seen += 1
        if seen == 3:
            choices.stop(0)
    assert seen == 3
