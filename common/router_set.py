"""A client of the routers (frontend, planner): any live replica of a ``--router`` list answers; a silent one is skipped for a while.

Every router replica is fed by every worker and kvtier, so any of them can route. A request goes to the router
that answered last; a router silent for ``failover_s`` is marked down for ``down_s`` and the request is sent to
the next one at once (a killed router costs each request in flight on it at most ``failover_s``).
"""

from __future__ import annotations

import time

import structlog
import zmq.asyncio

from common.errors import TransportTimeout
from common.protocol import Message
from common.router_link import split_endpoints
from common.transport import Client, TransportConfig

log = structlog.get_logger(__name__)


def pick_router(num_routers: int, preferred: int, down_until_s: list[float], now_s: float) -> int:
    """The router to ask: the preferred one if it is up, else the next one up in ring order, else (all down)
    the one whose down mark ends first."""
    for step in range(num_routers):
        i = (preferred + step) % num_routers
        if down_until_s[i] <= now_s:
            return i
    return min(range(num_routers), key=lambda i: down_until_s[i])


class RouterSet:
    def __init__(self, ctx: zmq.asyncio.Context, routers: str, config: TransportConfig,
                 failover_s: float = 0.5, down_s: float = 2.0) -> None:
        self.endpoints = split_endpoints(routers)
        self._clients = [Client(ctx, endpoint, config.toward("router")) for endpoint in self.endpoints]
        self._failover_s = failover_s
        self._down_s = down_s
        self._down_until_s = [0.0] * len(self._clients)
        self._preferred = 0

    async def request(self, msg: Message, timeout_s: float) -> Message:
        """``msg``'s reply from a live router within ``timeout_s``; ``TransportTimeout`` when none answered.
        The message is the same on every try: a router acts on a request id once (routes are idempotent)."""
        deadline_s = time.monotonic() + timeout_s
        while True:
            now_s = time.monotonic()
            remaining_s = deadline_s - now_s
            if remaining_s <= 0:
                raise TransportTimeout(f"no router of {', '.join(self.endpoints)} answered within {timeout_s} s")
            i = pick_router(len(self._clients), self._preferred, self._down_until_s, now_s)
            attempt_s = min(remaining_s, self._failover_s) if len(self._clients) > 1 else remaining_s
            try:
                reply = await self._clients[i].request(msg, attempt_s)
            except TransportTimeout:
                if len(self._clients) == 1:
                    raise
                if self._down_until_s[i] <= time.monotonic():
                    log.warning("router_silent", router=self.endpoints[i], failover_s=self._failover_s)
                self._down_until_s[i] = time.monotonic() + self._down_s
                continue
            self._down_until_s[i] = 0.0
            self._preferred = i
            return reply

    async def close(self) -> None:
        for client in self._clients:
            await client.close()
