"""`splitserve router set-role WORKER ROLE`: move a switchable worker between the prefill and decode pools in place.

For operators and tests; the planner sends the same ``SetRole`` (docs/architecture.md#roles). Prints the router's
``RoleSet`` answer as one JSON line; exit 0 when the worker serves that role, 1 when refused, 2 when no router
answered.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Optional

import typer

from cli.options import DEFAULT_ROUTER, CurveDir, transport


async def request_role(routers: str, worker_id: str, role: str, reason: str, timeout_s: float, config=None):
    """Ask any live router of ``routers`` to move ``worker_id`` to ``role``; its ``RoleSet`` answer."""
    import zmq.asyncio

    from common.protocol import RoleSet, SetRole
    from common.router_set import RouterSet
    from common.transport import TransportConfig, new_id

    ctx = zmq.asyncio.Context()
    router_set = RouterSet(ctx, routers, config or TransportConfig())
    try:
        reply = await router_set.request(SetRole(request_id=new_id("setrole"), worker_id=worker_id,
                                                 role=role, reason=reason), timeout_s)  # type: ignore[arg-type]
    finally:
        await router_set.close()
        ctx.term()
    if not isinstance(reply, RoleSet):
        raise RuntimeError(f"router answered {reply!r}")
    return reply


def set_role(
    worker_id: str = typer.Argument(..., help="The worker's id (as `splitserve up` or --worker-id named it)"),
    role: str = typer.Argument(..., help="prefill | decode"),
    router_endpoint: str = typer.Option(DEFAULT_ROUTER, "--router", envvar="SPLITSERVE_ROUTER",
                                        help="Router endpoint, or replicas comma-separated (any one answers)"),
    reason: str = typer.Option("operator", help="Logged by the router and the worker"),
    timeout_s: float = typer.Option(5.0, help="Wait this long for the answer"),
    curve_dir: Optional[Path] = CurveDir,
) -> None:
    """Move a switchable worker to the prefill or decode pool in place (no restart, no request dropped)."""
    import msgspec

    from common.errors import TransportTimeout

    if role not in ("prefill", "decode"):
        raise typer.BadParameter(f"role must be prefill or decode, not {role!r}")
    try:
        answer = asyncio.run(request_role(router_endpoint, worker_id, role, reason, timeout_s,
                                          transport(curve_dir, "planner")))
    except TransportTimeout as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    fields = msgspec.structs.asdict(answer)
    fields.pop("request_id")
    typer.echo(msgspec.json.encode(fields).decode())
    raise typer.Exit(0 if answer.ok else 1)
