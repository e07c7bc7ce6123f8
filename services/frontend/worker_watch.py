"""Which workers' streams the frontend fails so that their requests migrate, from the router's worker list: a
pure judgement, table-tested (tests/services/frontend/test_worker_watch.py).

A worker is lost when it is missing from ``lost_polls`` lists in a row (gone, or cut off), or at once when its
endpoint is listed with another ``instance_id``: it was restarted in place (a supervisor starts the same command,
the same endpoint) and the new process knows nothing of the streams the old one was serving, which would
otherwise wait forever for tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from common.protocol import WorkerList


@dataclass(frozen=True, slots=True)
class WatchVerdict:
    lost: tuple[tuple[str, str], ...]  # (endpoint, why) of each worker whose streams fail now
    missing_polls: dict[str, int]  # endpoint -> lists in a row it was missing from
    instances: dict[str, str]  # endpoint -> instance_id last listed there


def judge_workers(in_use: Iterable[str], listed: WorkerList, missing_polls: Mapping[str, int],
                  instances: Mapping[str, str], lost_polls: int) -> WatchVerdict:
    """``in_use``: endpoints the frontend holds streams (clients) to."""
    now = {w.endpoint: w.instance_id for w in listed.workers}
    missing, known, lost = dict(missing_polls), {**instances, **now}, []
    for endpoint in in_use:
        if endpoint in now:
            missing.pop(endpoint, None)
            before = instances.get(endpoint, "")
            if before and now[endpoint] and before != now[endpoint]:
                lost.append((endpoint, f"worker at {endpoint} restarted ({before} -> {now[endpoint]})"))
            continue
        missing[endpoint] = missing.get(endpoint, 0) + 1
        if missing[endpoint] >= lost_polls:
            del missing[endpoint]
            known.pop(endpoint, None)
            lost.append((endpoint, f"worker at {endpoint} left the cluster"))
    return WatchVerdict(lost=tuple(lost), missing_polls=missing, instances=known)
