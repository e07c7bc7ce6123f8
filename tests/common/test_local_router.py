"""A frontend's hosted router answers as a router process would: replies as they are, refusals raised."""

from __future__ import annotations

import pytest

from common.errors import RemoteError
from common.local_router import LocalRouter
from common.protocol import ErrorReply, ListWorkers, WorkerList


async def test_replies_pass_and_refusals_raise() -> None:
    asked = []

    def answer(msg):
        asked.append(msg)
        if isinstance(msg, ListWorkers):
            return WorkerList(request_id=msg.request_id, workers=(), loads=())
        return ErrorReply(request_id=msg.request_id, code="no_worker", message="none serves m")

    router = LocalRouter(answer)
    assert await router.request(ListWorkers(request_id="ls"), 1.0) == WorkerList(request_id="ls", workers=(), loads=())
    with pytest.raises(RemoteError) as refused:
        await router.request(ErrorReply(request_id="x", code="", message=""), 1.0)
    assert refused.value.code == "no_worker"
    assert len(asked) == 2
