"""``n`` choices of one request: the prompt prefilled once, every choice decoded on the same decode worker.

Choice 0 takes the normal path (router, remote prefill, KV pull). Once its decode worker streams, the prompt's
KV sits in that worker's prefix cache, so choices 1..n-1 go straight to it as local requests (no prefill
worker, no second pull): only the prompt's last, partial block is recomputed. With a seed, choice i samples
with seed + i (choice 0 then equals the n=1 answer); under greedy decoding every choice is the same text.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing

from msgspec.structs import replace

from common.protocol import Route, SamplingParams, Tokens
from services.frontend.pipeline import Pipeline

MAX_CHOICES = 16


class Choices:
    """Merged output slices of ``n`` choices as (index, Tokens); ``stop(index)`` ends one early."""

    def __init__(self, pipeline: Pipeline, request_id: str, model: str, token_ids: tuple[int, ...],
                 sampling: SamplingParams, n: int, lora_name: str = "") -> None:
        self._pipeline = pipeline
        self._lora_name = lora_name  # of ``model``; "": the base model
        self._request_id = request_id
        self._model = model
        self._token_ids = token_ids
        self._sampling = sampling
        self._n = n
        self._queue: asyncio.Queue[tuple[int, Tokens | BaseException | None]] | None = None  # n > 1 only
        self._decoding: asyncio.Future[Route | None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._open: set[int] = set()

    async def __aiter__(self) -> AsyncIterator[tuple[int, Tokens]]:
        self._open = set(range(self._n))
        if self._n == 1:
            # The common case, on the hot path: no task and no queue between the worker's stream and the client.
            gen = self._pipeline.generate(self._request_id, self._model, self._token_ids, self._sampling,
                                          lora_name=self._lora_name)
            async with aclosing(gen):
                async for out in gen:
                    yield 0, out
                    if not self._open:
                        return  # stop(0): closing the stream aborts the request on its worker
            return
        self._queue = asyncio.Queue()
        self._decoding = asyncio.get_running_loop().create_future()
        self._tasks = [asyncio.create_task(self._choice(i)) for i in range(self._n)]
        try:
            while self._open:
                index, item = await self._queue.get()
                if index not in self._open:
                    continue  # stopped: whatever it still had in flight is dropped
                if item is None:
                    self._open.discard(index)
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield index, item
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def stop(self, index: int) -> None:
        """End choice ``index`` now (a stop string): its worker aborts it; the others go on."""
        self._open.discard(index)
        if self._tasks:
            self._tasks[index].cancel()

    def _decode_started(self, route: Route) -> None:
        assert self._decoding is not None
        if not self._decoding.done():
            self._decoding.set_result(route)

    async def _choice(self, index: int) -> None:
        assert self._decoding is not None and self._queue is not None
        route = None
        request_id, sampling = self._request_id, self._sampling
        if index > 0:
            request_id = f"{self._request_id}-{index}"
            if sampling.seed is not None:
                sampling = replace(sampling, seed=sampling.seed + index)
            decoding = await self._decoding  # None: choice 0 ended before decoding; route on its own
            if decoding is not None:
                route = Route(request_id=request_id, decode=decoding.decode)
        on_decode = self._decode_started if index == 0 and self._n > 1 else None
        try:
            gen = self._pipeline.generate(request_id, self._model, self._token_ids, sampling, route, on_decode,
                                          self._lora_name)
            async with aclosing(gen):
                async for out in gen:
                    self._queue.put_nowait((index, out))
        except Exception as exc:  # noqa: BLE001  the consumer re-raises it (WorkerLost, RemoteError, NoWorkerError)
            self._queue.put_nowait((index, exc))
        finally:
            if index == 0 and not self._decoding.done():
                self._decoding.set_result(None)
        self._queue.put_nowait((index, None))
