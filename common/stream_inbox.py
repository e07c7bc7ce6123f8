"""One request's replies from a peer, in arrival order, for the one task that reads them.

``asyncio.Queue`` pays for what a stream never needs (a size bound, many getters and putters, ``task_done``
accounting): ~1 us a put and a get, once per token on both ends of the frontend's hot path. This is a deque and
at most one waiting reader. ``coalesce`` (optional) may join a reply into the one queued before it while the reader
has not taken that yet (``common/tokens_merge.py``: a reader that fell behind takes one slice, not several).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

Coalesce = Callable[[Any, Any], Any]  # (queued, new) -> the two as one, or None to keep them apart


class StreamInbox:
    __slots__ = ("_items", "_waiter", "_coalesce")

    def __init__(self, coalesce: Coalesce | None = None) -> None:
        self._items: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._coalesce = coalesce

    def put_nowait(self, item: Any) -> None:
        items = self._items
        if items and self._coalesce is not None and (joined := self._coalesce(items[-1], item)) is not None:
            items[-1] = joined
        else:
            items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def empty(self) -> bool:
        return not self._items

    def qsize(self) -> int:
        return len(self._items)

    def get_nowait(self) -> Any:
        if not self._items:
            raise asyncio.QueueEmpty
        return self._items.popleft()

    async def get(self) -> Any:
        while not self._items:
            if self._waiter is not None:
                raise RuntimeError("one reader at a time on a StreamInbox")
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()
