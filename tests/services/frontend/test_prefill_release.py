"""The frontend tells a prefill worker when its finished prefill's KV will not be read (so its engine frees the
blocks now, not at the end of their lease), and only then. Real sockets on loopback; the two workers are bare
ROUTER sockets that answer as a prefill worker and a decode worker do."""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio

from cli.launcher import free_port
from common.errors import RemoteError
from common.protocol import (
    Abort,
    ErrorReply,
    Generate,
    KvTransferParams,
    Route,
    SamplingParams,
    Tokens,
    WorkerRef,
    decode,
    encode,
)
from services.frontend.metrics import FrontendMetrics
from services.frontend.pipeline import Pipeline, PipelineConfig

KV = KvTransferParams(remote_engine_id="prefill-0", remote_block_ids=(1, 2, 3))


class FakeWorker:
    """A worker's ROUTER socket: records what it gets, answers a Generate with ``answer(msg)``."""

    def __init__(self, ctx: zmq.asyncio.Context, answer) -> None:
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.bind(self.endpoint)
        self.answer = answer
        self.got: list = []
        self.task = asyncio.get_running_loop().create_task(self._serve())

    async def _serve(self) -> None:
        while True:
            identity, payload = await self.sock.recv_multipart()
            msg = decode(payload)
            self.got.append(msg)
            if isinstance(msg, Generate):
                for reply in self.answer(msg):
                    await self.sock.send_multipart([identity, encode(reply)])

    def kinds(self) -> list[str]:
        return [type(m).__name__ for m in self.got]

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        self.sock.close(linger=0)


def prefilled(msg: Generate) -> list:
    return [Tokens(request_id=msg.request_id, token_ids=(7,), finish_reason="length", kv_transfer=KV)]


def decoding(msg: Generate) -> list:
    return [Tokens(request_id=msg.request_id, token_ids=(8,)),
            Tokens(request_id=msg.request_id, token_ids=(9,), finish_reason="length")]


def refusing(msg: Generate) -> list:
    return [ErrorReply(request_id=msg.request_id, code="engine_error", message="refused")]


async def _until(check, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)


@pytest.mark.parametrize(
    ("case", "max_tokens", "decode_answer", "released"),
    [
        ("decode streams: it reads the KV", 3, decoding, False),
        ("decode worker refuses the hand-off", 3, refusing, True),
        ("the prefill's token is the whole answer", 1, decoding, True),
        ("client gone before the decode was sent", 3, decoding, True),
    ],
)
async def test_a_finished_prefill_is_released_when_no_decode_reads_it(case, max_tokens, decode_answer,
                                                                       released) -> None:
    ctx = zmq.asyncio.Context()
    prefill, decode_worker = FakeWorker(ctx, prefilled), FakeWorker(ctx, decode_answer)
    # A client can leave after the first token and before the decode is sent only when the first token is not
    # held for the decode's first output (--first-token prefill).
    first_token = "prefill" if case.startswith("client gone") else "decode"
    pipeline = Pipeline(PipelineConfig(router_endpoint=f"tcp://127.0.0.1:{free_port()}", first_token=first_token),
                        FrontendMetrics())
    route = Route(request_id="r1", decode=WorkerRef(worker_id="d", endpoint=decode_worker.endpoint),
                  prefill=WorkerRef(worker_id="p", endpoint=prefill.endpoint))
    try:
        stream = pipeline.generate("r1", "m", tuple(range(3, 40)), SamplingParams(max_tokens=max_tokens), route)
        tokens: list[int] = []
        try:
            async for out in stream:
                tokens.extend(out.token_ids)
                if case.startswith("client gone"):
                    break  # the HTTP client left after the first token
        except RemoteError:
            assert case == "decode worker refuses the hand-off"
        await stream.aclose()
        await _until(lambda: "Abort" in prefill.kinds(), timeout_s=2.0 if released else 0.3)
        assert prefill.kinds() == (["Generate", "Abort"] if released else ["Generate"]), case
        if released:
            assert prefill.got[1] == Abort(request_id="r1")
        if max_tokens == 1 or case.startswith("client gone"):
            assert decode_worker.got == [] and tokens == [7]
    finally:
        await pipeline.close()
        await prefill.close()
        await decode_worker.close()
        ctx.destroy(linger=0)
