"""The launcher's child processes, as one set whose every change is announced.

Starting, restarting and removing a child all go through ``ChildSet``, so whatever mirrors the set (the Prometheus
file-SD target list) follows each change, whichever path made it: the initial graph, the planner's scale-ups, a
crash restart or a drained worker leaving.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass


@dataclass
class Child:
    service: str
    cmd: list[str]
    proc: subprocess.Popen[bytes]
    started_s: float  # monotonic
    role: str = ""  # workers: prefill | decode | both
    worker_id: str = ""
    draining: bool = False


class ChildSet:
    def __init__(self, on_change: Callable[[Sequence[Child]], None]) -> None:
        self._children: list[Child] = []
        self._on_change = on_change

    def __iter__(self) -> Iterator[Child]:
        return iter(list(self._children))  # a copy: callers change the set while they walk it

    def __len__(self) -> int:
        return len(self._children)

    def add(self, *children: Child) -> None:
        self._children.extend(children)
        self._on_change(tuple(self._children))

    def replace(self, old: Child, new: Child) -> None:
        self._children[self._children.index(old)] = new
        self._on_change(tuple(self._children))

    def remove(self, child: Child) -> None:
        self._children.remove(child)
        self._on_change(tuple(self._children))

    def procs(self) -> list[subprocess.Popen[bytes]]:
        return [c.proc for c in self._children]
