"""A stream's idle timeout as one timer per stream, not one per token.

``asyncio.timeout`` around each ``queue.get()`` costs a context manager and a timer handle per token (~3 us of
the frontend's CPU per token at 16 tokens a request: ~10% of a short request). ``IdleWatch`` keeps one timer
and, when one wait on the (empty) stream queue has lasted ``timeout_s``, puts ``SILENT`` into the queue: the
reader takes it like any reply and gives up, exactly as the per-token timeout did.
"""

from __future__ import annotations

import asyncio
from typing import Any

from common.stream_inbox import StreamInbox

SILENT: Any = object()  # what the watch puts into the queue: the worker was silent for timeout_s


class IdleWatch:
    __slots__ = ("_loop", "_queue", "_timeout_s", "_timer", "waiting_since")

    def __init__(self, queue: StreamInbox, timeout_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue = queue
        self._timeout_s = timeout_s
        # Loop time (s) the reader began waiting on an empty queue; None while it is not waiting.
        self.waiting_since: float | None = None
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(timeout_s, self._check)

    def _check(self) -> None:
        since = self.waiting_since
        now = self._loop.time()
        if since is not None and self._queue.empty() and now - since >= self._timeout_s:
            self._timer = None
            self._queue.put_nowait(SILENT)
            return
        # Not waiting, or a reply is queued (the reader wakes next): look again one timeout after the wait began.
        due = since + self._timeout_s if since is not None and since + self._timeout_s > now else now + self._timeout_s
        self._timer = self._loop.call_at(due, self._check)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
