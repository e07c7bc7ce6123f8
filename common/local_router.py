"""The router a frontend asks when it hosts a router replica in its own process (`frontend --router-inside`).

The same answers as ``RouterSet``'s (a ``Route``, a ``WorkerList``; a refusal raised as ``RemoteError``), from the
router's own decision function called in this process: no message, no wake-up of another process, no hop. The
replica is a whole router (workers and kvtier register with it and feed it their events like any other), so the
decision is the one a router process would make.
"""

from __future__ import annotations

from collections.abc import Callable

from common.errors import RemoteError
from common.protocol import ErrorReply, Message


class LocalRouter:
    def __init__(self, answer: Callable[[Message], Message]) -> None:
        self._answer = answer  # the hosted router's answer to a RouteRequest or ListWorkers

    async def request(self, msg: Message, timeout_s: float) -> Message:  # noqa: ARG002  (nothing to wait for)
        reply = self._answer(msg)
        if isinstance(reply, ErrorReply):
            raise RemoteError(reply.code, reply.message)
        return reply

    async def close(self) -> None:
        return None  # the replica is stopped with the process's other services
