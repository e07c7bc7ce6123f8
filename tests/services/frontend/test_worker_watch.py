"""Which workers' streams the frontend fails (services/frontend/worker_watch.py)."""

from __future__ import annotations

import pytest

from common.protocol import WorkerInfo, WorkerList, WorkerLoad
from services.frontend.worker_watch import judge_workers

A, B = "tcp://10.0.0.1:1", "tcp://10.0.0.2:1"


def _listed(*workers: tuple[str, str]) -> WorkerList:
    infos = tuple(WorkerInfo(worker_id=f"w{i}", role="decode", model="m", block_size=16, num_blocks=8, endpoint=e,
                             instance_id=inst) for i, (e, inst) in enumerate(workers))
    return WorkerList(request_id="r", workers=infos, loads=(WorkerLoad(),) * len(infos))


@pytest.mark.parametrize(("listed", "missing", "instances", "lost", "missing_after", "instances_after"), [
    # Listed as before: nothing lost.
    (_listed((A, "i1")), {}, {A: "i1"}, (), {}, {A: "i1"}),
    # Seen for the first time: its instance is learnt, nothing lost.
    (_listed((A, "i1")), {}, {}, (), {}, {A: "i1"}),
    # Restarted in place (same endpoint, new instance): lost at once, the new instance learnt.
    (_listed((A, "i2")), {}, {A: "i1"}, ((A, "restarted"),), {}, {A: "i2"}),
    # Missing once, then twice: not yet lost; back again: the count is reset.
    (_listed(), {}, {A: "i1"}, (), {A: 1}, {A: "i1"}),
    (_listed(), {A: 1}, {A: "i1"}, (), {A: 2}, {A: "i1"}),
    (_listed((A, "i1")), {A: 2}, {A: "i1"}, (), {}, {A: "i1"}),
    # Missing a third time: lost, forgotten.
    (_listed(), {A: 2}, {A: "i1"}, ((A, "left the cluster"),), {}, {}),
    # A worker with no instance id (an old one) is never judged restarted.
    (_listed((A, "")), {}, {A: "i1"}, (), {}, {A: ""}),
])
def test_judge_workers(listed, missing, instances, lost, missing_after, instances_after) -> None:
    verdict = judge_workers([A], listed, missing, instances, lost_polls=3)
    assert len(verdict.lost) == len(lost)
    assert all(e == want_e and want_why in why for (e, why), (want_e, want_why) in zip(verdict.lost, lost))
    assert verdict.missing_polls == missing_after and verdict.instances == instances_after


def test_endpoints_not_in_use_are_learnt_but_never_lost() -> None:
    verdict = judge_workers([A], _listed((A, "i1"), (B, "j2")), {}, {B: "j1"}, lost_polls=3)
    assert verdict.lost == () and verdict.instances == {A: "i1", B: "j2"}
