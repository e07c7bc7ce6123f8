"""How the local launcher answers a ``ScaleRequest``: which worker processes to start or drain.

Pure, so it is table-tested: the launcher owns processes, this decides. A target counts workers that serve
or are starting; draining ones are on their way out and never count. Scale-down drains the youngest
workers first (their caches are the coldest), one SIGTERM each: the worker finishes what it holds, then exits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import structlog
import zmq

from common.errors import ProtocolError
from common.protocol import Role, RoleSet, ScaleRequest, decode
from common.security import CurveKeys
from services.planner.subscribe import subscribe_scale_requests

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class PoolMember:
    name: str  # worker id
    role: Role
    started_s: float  # monotonic, when its process started
    draining: bool = False


@dataclass(frozen=True, slots=True)
class ScaleActions:
    start: int = 0  # new workers of the pool's role
    drain: tuple[str, ...] = ()  # worker ids to SIGTERM


def scale_actions(members: Sequence[PoolMember], role: Role, target: int, max_total: int) -> ScaleActions:
    """Make ``role``'s live workers ``target`` (never above ``max_total`` live workers in all pools)."""
    live = [m for m in members if m.role == role and not m.draining]
    total_live = sum(1 for m in members if not m.draining)
    if target > len(live):
        return ScaleActions(start=max(0, min(target - len(live), max_total - total_live)))
    if target < len(live):
        youngest = sorted(live, key=lambda m: m.started_s, reverse=True)
        return ScaleActions(drain=tuple(m.name for m in youngest[: len(live) - target]))
    return ScaleActions()


class ScaleEvents:
    """The planner's ScaleRequests, latest per pool (a plain SUB socket: the launcher loop is synchronous).

    The planner also publishes each ``RoleSet`` the router answered to its ``SetRole`` (a worker moved pool in
    place), before that interval's ScaleRequests: ``take_roles`` hands them over, so the launcher counts the
    moved worker in its new pool (and restarts it in that role) before it compares the targets.
    """

    def __init__(self, endpoint: str, curve: CurveKeys | None = None) -> None:
        self._ctx = zmq.Context()
        self._sub = subscribe_scale_requests(self._ctx, endpoint, curve)
        self._roles: dict[str, Role] = {}

    def take_roles(self) -> dict[str, Role]:
        """Workers moved since the last call: worker id -> its role now."""
        roles, self._roles = self._roles, {}
        return roles

    def poll(self, not_before_s: float = 0.0) -> dict[str, int]:
        """The latest target per pool; requests decided before ``not_before_s`` (epoch s) are dropped: a planner
        that looked while the graph's engines were still starting saw pools short of workers that were coming."""
        latest: dict[str, int] = {}
        while True:
            try:
                data = self._sub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return latest
            try:
                msg = decode(data)
            except ProtocolError as exc:
                log.warning("dropped_message", reason=str(exc))
                continue
            match msg:
                case ScaleRequest(pool=pool, target=target, time_s=time_s) if time_s >= not_before_s:
                    latest[pool] = target
                case ScaleRequest():
                    pass
                case RoleSet(worker_id=worker_id, role=role, ok=True):
                    self._roles[worker_id] = role
                case RoleSet():
                    pass  # refused: the worker stayed where it was
                case _:
                    log.warning("dropped_message", reason=f"launcher does not handle {type(msg).__name__}")

    def close(self) -> None:
        self._sub.close()
        self._ctx.term()
