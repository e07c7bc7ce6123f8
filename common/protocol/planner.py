"""planner -> orchestrators (PUB): how many workers each pool should have."""

from __future__ import annotations

from common.protocol.base import Msg, Role

# ------------------------------------------------------------------------------ planner -> orchestrators (PUB)


class ScaleRequest(Msg, frozen=True):
    """The planner wants ``pool`` to have ``target`` workers (published; any orchestrator may act on it).

    Idempotent: the latest request per pool wins, so an orchestrator that missed some only acts on the last.
    Scale-down means drain: SIGTERM a worker of that pool (it finishes its requests, then exits).
    """

    seq: int
    pool: Role
    current: int
    target: int
    # Why, as data: {"signal": "ttft_p90_ms", "observed": 812.0, "limit": 500.0, ...} rendered to text.
    reason: str = ""
    # Seconds since the epoch when decided (orchestrators ignore stale requests after a restart).
    time_s: float = 0.0


# ------------------------------------------------------------------- planner -> router: roles switched in place


class SetRole(Msg, frozen=True):
    """Move a running worker to another pool in place (planner or operator -> router, on its ROUTER socket).

    Only a worker whose engine serves both sides of P/D (``WorkerInfo.switchable``) can move. The router stops
    giving it work of the old role at once, lets the old role's requests on it finish (KV already pulled from it
    is still served) and gives it new work of ``role``. The worker is told, so a router that (re)starts learns the
    role from the worker's registration. Answered with ``RoleSet``.

    The router that takes it forwards it (with a request id of its own) to the worker's ``RouterLink``, and the
    worker answers that router with a ``RoleSet`` after it switched and sent every router a ``Heartbeat`` with
    its new ``role``: the worker is the source of truth, so router replicas and restarted routers agree.
    """

    request_id: str
    worker_id: str
    role: Role  # "prefill" or "decode"
    reason: str = ""


class RoleSet(Msg, frozen=True):
    """The router's answer to ``SetRole``: the worker's role now, or why it did not move."""

    request_id: str
    worker_id: str
    role: Role
    ok: bool
    # Why refused ("unknown worker", "not switchable", "last worker of its pool", ...); "" when ok.
    reason: str = ""
    # From the router taking the decision to the worker serving its new role, seconds (0 when refused).
    seconds: float = 0.0
