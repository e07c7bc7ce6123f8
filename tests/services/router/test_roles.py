"""SetRole at the router: the pure check (table), and the switch as the service runs it (forward to the worker,
move on its answer or its heartbeat, answer the asker, give up on a silent worker)."""

from __future__ import annotations

import pytest

from common.protocol import (
    PROTOCOL_VERSION,
    Heartbeat,
    RegisterWorker,
    RoleSet,
    Route,
    RouteRequest,
    SetRole,
    WorkerInfo,
    WorkerLoad,
)
from services.router.registry import WorkerEntry
from services.router.roles import check_set_role
from services.router.service import RouterConfig, RouterService


def info(worker_id: str, role: str, switchable: bool = True, model: str = "m") -> WorkerInfo:
    return WorkerInfo(worker_id=worker_id, role=role, model=model, block_size=4, num_blocks=64,  # type: ignore[arg-type]
                      endpoint=f"tcp://127.0.0.1:{abs(hash(worker_id)) % 1000 + 1}", switchable=switchable)


def entry(worker_id: str, role: str, switchable: bool = True, draining: bool = False, model: str = "m") -> WorkerEntry:
    return WorkerEntry(info=info(worker_id, role, switchable, model), load=WorkerLoad(), last_seen_s=0.0,
                       draining=draining)


PD = [entry("p0", "prefill"), entry("d0", "decode")]
PDF = [*PD, entry("f0", "prefill")]


@pytest.mark.parametrize(("workers", "worker_id", "role", "switching", "ok", "reason", "unchanged"), [
    (PDF, "f0", "decode", (), True, "", False),
    (PDF, "d0", "prefill", (), False, "last serving worker of the decode pool", False),
    (PD, "p0", "decode", (), False, "last serving worker of the prefill pool", False),
    (PDF, "f0", "prefill", (), True, "already prefill", True),
    (PDF, "f0", "both", (), False, "role must be prefill or decode, not 'both'", False),
    (PDF, "ghost", "decode", (), False, "unknown worker 'ghost'", False),
    ([*PD, entry("f0", "prefill", switchable=False)], "f0", "decode", (), False,
     "not switchable (its engine serves one side of P/D only)", False),
    ([*PD, entry("f0", "prefill", draining=True)], "f0", "decode", (), False, "draining", False),
    (PDF, "f0", "decode", ("f0",), False, "a switch of this worker is in progress", False),
    # A draining peer does not count as serving its pool; another model's workers are another pool.
    ([entry("p0", "prefill"), entry("d0", "decode"), entry("d1", "decode", draining=True)], "d0", "prefill", (),
     False, "last serving worker of the decode pool", False),
    ([entry("p0", "prefill"), entry("d0", "decode"), entry("d1", "decode", model="other")], "d0", "prefill", (),
     False, "last serving worker of the decode pool", False),
    # "both" serves the decode pool: it may go to decode any time, to prefill only with another decoder left.
    ([entry("b0", "both"), entry("b1", "both")], "b0", "prefill", (), True, "", False),
    ([entry("b0", "both")], "b0", "prefill", (), False, "last serving worker of the decode pool", False),
    ([entry("b0", "both")], "b0", "decode", (), True, "", False),
])
def test_check_set_role(workers, worker_id, role, switching, ok, reason, unchanged) -> None:
    check = check_set_role(workers, worker_id, role, switching)
    assert (check.ok, check.reason, check.unchanged) == (ok, reason, unchanged)


class Sent(list):
    def __call__(self, identity: bytes, msg) -> None:
        self.append((identity, msg))


def router_with(*infos: WorkerInfo) -> tuple[RouterService, Sent]:
    svc = RouterService(RouterConfig(pending_ttl_s=0))
    sent = Sent()
    svc.roles._send = sent  # what the service would send on its ROUTER socket
    for i in infos:
        svc.handle(i.worker_id.encode(), RegisterWorker(request_id=f"reg-{i.worker_id}", info=i,
                                                        protocol_version=PROTOCOL_VERSION))
    return svc, sent


def role_gauge(svc: RouterService, worker_id: str, role: str) -> float | None:
    return svc.metrics.registry.get_sample_value("splitserve_router_worker_role", {"worker_id": worker_id, "role": role})


def test_switch_is_forwarded_and_answered_once_the_worker_confirms() -> None:
    svc, sent = router_with(info("p0", "prefill"), info("d0", "decode"), info("f0", "prefill"))
    assert svc.handle(b"planner", SetRole(request_id="s1", worker_id="f0", role="decode", reason="test")) is None
    ((to, forwarded),) = sent
    assert to == b"f0" and isinstance(forwarded, SetRole) and forwarded.role == "decode"
    assert forwarded.request_id != "s1" and forwarded.reason == "test"
    assert svc.registry.get("f0").info.role == "prefill"  # moved on the worker's word, not before
    # A second ask while this one is in flight is refused at once.
    again = svc.handle(b"planner", SetRole(request_id="s2", worker_id="f0", role="decode"))
    assert isinstance(again, RoleSet) and not again.ok and "in progress" in again.reason
    # The worker's heartbeat (sent before its answer) moves it; its answer then answers the asker.
    svc.handle(b"f0", Heartbeat(worker_id="f0", load=WorkerLoad(), role="decode"))
    assert svc.registry.get("f0").info.role == "decode"
    assert svc.handle(b"f0", RoleSet(request_id=forwarded.request_id, worker_id="f0", role="decode", ok=True)) is None
    to, answer = sent[-1]
    assert to == b"planner" and isinstance(answer, RoleSet)
    assert (answer.request_id, answer.worker_id, answer.role, answer.ok) == ("s1", "f0", "decode", True)
    assert 0.0 < answer.seconds < 1.0
    assert role_gauge(svc, "f0", "decode") == 1.0 and role_gauge(svc, "f0", "prefill") is None
    labels = {"worker_id": "f0", "role": "decode", "node": "", "zone": ""}
    assert svc.metrics.registry.get_sample_value("splitserve_router_worker_info", labels) == 1.0
    assert svc.metrics.registry.get_sample_value("splitserve_router_role_switch_seconds_count") == 1.0
    assert svc.metrics.registry.get_sample_value("splitserve_router_role_switches_total", {"result": "ok"}) == 1.0


def test_new_work_follows_the_new_role() -> None:
    # Before the switch f0 is only ever a prefill worker, after it only a decode one (fresh prompts after: the
    # moved worker keeps its cache, and a prompt it prefilled would now be prefilled locally there, rightly).
    svc, sent = router_with(info("p0", "prefill"), info("d0", "decode"), info("f0", "prefill"))

    def routes(n: int, salt: int) -> list[Route]:
        # Past the local-prefill threshold (a remote prefill), no prefix shared with the other calls' prompts.
        starts = [salt * 10000 + i * 1000 for i in range(n)]
        out = [svc.handle(b"fe", RouteRequest(request_id=f"r{start}", model="m", token_ids=tuple(range(start, start + 600))))
               for start in starts]
        assert all(isinstance(r, Route) for r in out)
        return out  # type: ignore[return-value]

    before = routes(6, salt=1)
    assert {r.decode.worker_id for r in before} == {"d0"}
    assert "f0" in {r.prefill.worker_id for r in before if r.prefill}
    svc.handle(b"planner", SetRole(request_id="s1", worker_id="f0", role="decode"))
    svc.handle(b"f0", RoleSet(request_id=sent[0][1].request_id, worker_id="f0", role="decode", ok=True))
    after = routes(6, salt=2)
    assert {r.prefill.worker_id for r in after if r.prefill} == {"p0"}
    assert "f0" in {r.decode.worker_id for r in after}


def test_refusals_are_answered_at_once() -> None:
    svc, sent = router_with(info("p0", "prefill"), info("d0", "decode", switchable=False), info("f0", "decode"))
    last = svc.handle(b"planner", SetRole(request_id="s1", worker_id="p0", role="decode"))
    assert isinstance(last, RoleSet) and not last.ok and last.role == "prefill" and "last" in last.reason
    fixed = svc.handle(b"planner", SetRole(request_id="s2", worker_id="d0", role="prefill"))
    assert isinstance(fixed, RoleSet) and not fixed.ok and "not switchable" in fixed.reason
    same = svc.handle(b"planner", SetRole(request_id="s3", worker_id="f0", role="decode"))
    assert isinstance(same, RoleSet) and same.ok and same.seconds == 0.0
    assert sent == []
    refused = svc.metrics.registry.get_sample_value("splitserve_router_role_switches_total", {"result": "refused"})
    assert refused == 2.0


def test_a_worker_that_refuses_or_stays_silent_is_not_moved() -> None:
    svc, sent = router_with(info("p0", "prefill"), info("d0", "decode"), info("f0", "prefill"), info("g0", "prefill"))
    svc.handle(b"planner", SetRole(request_id="s1", worker_id="f0", role="decode"))
    svc.handle(b"f0", RoleSet(request_id=sent[0][1].request_id, worker_id="f0", role="prefill", ok=False,
                              reason="draining"))
    answer = sent[-1][1]
    assert not answer.ok and answer.reason == "draining" and answer.seconds == 0.0
    assert svc.registry.get("f0").info.role == "prefill"
    svc.handle(b"planner", SetRole(request_id="s2", worker_id="g0", role="decode"))
    forwarded = sent[-1][1]
    svc.roles.expire(now_s=1e12)  # long past the timeout
    to, timed_out = sent[-1]
    assert to == b"planner" and timed_out.request_id == "s2" and not timed_out.ok and "did not answer" in timed_out.reason
    # Its late answer changes nothing here (its heartbeats would carry the role it took).
    svc.handle(b"g0", RoleSet(request_id=forwarded.request_id, worker_id="g0", role="decode", ok=True))
    assert sent[-1][1] is timed_out


def test_a_replica_follows_the_heartbeats_and_a_restarted_router_the_registration() -> None:
    # Another router's SetRole reaches us only through the worker: its beats carry the role it took.
    svc, sent = router_with(info("p0", "prefill"), info("d0", "decode"), info("f0", "prefill"))
    svc.handle(b"f0", Heartbeat(worker_id="f0", load=WorkerLoad(), role="decode"))
    assert svc.registry.get("f0").info.role == "decode" and role_gauge(svc, "f0", "decode") == 1.0
    svc.handle(b"f0", Heartbeat(worker_id="f0", load=WorkerLoad()))  # an older worker's beat: no role, no move
    assert svc.registry.get("f0").info.role == "decode"
    fresh, _ = router_with(info("p0", "prefill"), info("d0", "decode"), info("f0", "decode"))
    assert fresh.registry.get("f0").info.role == "decode"
