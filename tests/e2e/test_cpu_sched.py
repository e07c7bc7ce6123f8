"""A mock graph's processes, every thread of them (ZeroMQ's I/O threads too), run under SCHED_BATCH; the launcher
itself does not (cli/cpu_sched.py). Real processes of the session's mock P/D graph."""

from __future__ import annotations

import os
from pathlib import Path

from tests.harness.graph import Graph


def _policies(pid: int) -> set[int]:
    out = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out.add(os.sched_getscheduler(int(task.name)))
        except OSError:  # a thread that ended meanwhile
            continue
    return out


def test_every_process_of_a_mock_graph_is_batched(mock_pd: Graph) -> None:
    pids = mock_pd.pids()
    assert {"frontend", "router", "kvtier"} <= set(pids) and any(k.startswith("worker-") for k in pids)
    assert {name: _policies(pid) for name, pid in pids.items()} == {name: {os.SCHED_BATCH} for name in pids}
    assert _policies(mock_pd.proc.pid) == {os.SCHED_OTHER}
