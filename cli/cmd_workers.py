"""`splitserve router workers`: what a running router sees, one line a worker (or one JSON line with --json).

For operators checking a deployment (docs/multihost.md): every registered worker with its role, node, advertised
endpoint, engine, load and whether it drains. Exit 0 when a router answered, 2 when none did.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Optional

import typer

from cli.options import DEFAULT_ROUTER, CurveDir, transport

COLUMNS = ("worker_id", "role", "node", "endpoint", "engine", "model", "running", "waiting", "free_blocks",
           "state")


async def list_workers(routers: str, timeout_s: float, config=None):
    """Any live router of ``routers``'s ``WorkerList``."""
    import zmq.asyncio

    from common.protocol import ListWorkers, WorkerList
    from common.router_set import RouterSet
    from common.transport import TransportConfig, new_id

    ctx = zmq.asyncio.Context()
    router_set = RouterSet(ctx, routers, config or TransportConfig())
    try:
        reply = await router_set.request(ListWorkers(request_id=new_id("list")), timeout_s)
    finally:
        await router_set.close()
        ctx.term()
    if not isinstance(reply, WorkerList):
        raise RuntimeError(f"router answered {reply!r}")
    return reply


def worker_rows(listed) -> list[dict[str, object]]:
    """One row a worker, sorted by role then id."""
    draining = set(listed.draining)
    rows = [{"worker_id": w.worker_id, "role": w.role, "node": w.node, "endpoint": w.endpoint, "engine": w.engine,
             "model": w.model, "running": load.num_running, "waiting": load.num_waiting,
             "free_blocks": f"{load.num_free_blocks}/{load.num_total_blocks}",
             "state": "draining" if w.worker_id in draining else "serving",
             "engine_settings": dict(w.engine_settings)}  # --json only: the engine's effective vLLM config
            for w, load in zip(listed.workers, listed.loads, strict=True)]
    return sorted(rows, key=lambda r: (str(r["role"]), str(r["worker_id"])))


def format_table(rows: list[dict[str, object]]) -> str:
    widths = {c: max([len(c), *(len(str(r[c])) for r in rows)]) for c in COLUMNS}
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in COLUMNS)]
    lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in COLUMNS) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def workers(
    router_endpoint: str = typer.Option(DEFAULT_ROUTER, "--router", envvar="SPLITSERVE_ROUTER",
                                        help="Router endpoint, or replicas comma-separated (any one answers)"),
    as_json: bool = typer.Option(False, "--json", help='One JSON line with a "workers" list of rows'),
    timeout_s: float = typer.Option(5.0, help="Wait this long for the answer"),
    curve_dir: Optional[Path] = CurveDir,
) -> None:
    """List the workers a running router has registered: role, node, endpoint, load, serving or draining."""
    import orjson

    from common.errors import TransportTimeout

    try:
        listed = asyncio.run(list_workers(router_endpoint, timeout_s, transport(curve_dir, "planner")))
    except TransportTimeout as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    rows = worker_rows(listed)
    typer.echo(orjson.dumps({"workers": rows}).decode() if as_json else format_table(rows))
