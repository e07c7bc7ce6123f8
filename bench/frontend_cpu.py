"""bench/frontend.py's CPU accounting: every server process of a graph by name, and CPU per request from
/proc/<pid>/stat utime+stime deltas.

The server is the launcher's whole process tree (`up` itself, its router, workers and every frontend); the load
client is not part of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.lib.procs import proc_cpu_s, tree_pids


def _service_name(args: list[str]) -> str:
    """``frontend``, ``router``, ``worker-both-0``, ``launcher`` (the `up` process) from a command line."""
    try:
        service = args[args.index("cli.main") + 1]
    except (ValueError, IndexError):
        return "other"
    if service == "worker" and "--worker-id" in args:
        return "worker-" + args[args.index("--worker-id") + 1]
    return "launcher" if service == "up" else service


def server_processes(launcher_pid: int) -> dict[str, int]:
    """{name: pid} for the launcher's tree; several frontends: ``frontend-0``, ``frontend-1``, ... by pid."""
    named: list[tuple[str, int]] = []
    for pid in sorted(tree_pids(launcher_pid)):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        named.append((_service_name(args), pid))
    frontends = [pid for name, pid in named if name == "frontend"]
    out = {name: pid for name, pid in named if name != "frontend"}
    out.update({f"frontend-{i}": pid for i, pid in enumerate(frontends)})
    return out


def cpu_snapshot(pids: dict[str, int]) -> dict[str, float]:
    out = {}
    for name, pid in pids.items():
        try:
            out[name] = proc_cpu_s(pid)
        except OSError:  # exited: the delta would lie, so it shows as missing
            out[name] = float("nan")
    return out


@dataclass(frozen=True)
class CpuPerRequest:
    """Milliseconds of CPU per request while one measured run went on."""

    by_process: dict[str, float]
    server_total: float  # every process of the launcher's tree
    frontends_total: float  # every frontend process summed
    router: float
    workers_total: float
    launcher: float

    def as_dict(self) -> dict[str, object]:
        return {"server_total": self.server_total, "frontends_total": self.frontends_total, "router": self.router,
                "workers_total": self.workers_total, "launcher": self.launcher, "by_process": self.by_process}


def cpu_per_request(before: dict[str, float], after: dict[str, float], num_requests: int) -> CpuPerRequest:
    n = max(1, num_requests)
    per = {name: round((after[name] - before[name]) * 1e3 / n, 4) for name in before if name in after}

    def total(prefix: str) -> float:
        return round(sum(v for k, v in per.items() if k.startswith(prefix)), 4)

    return CpuPerRequest(by_process=per, server_total=round(sum(per.values()), 4), frontends_total=total("frontend"),
                         router=total("router"), workers_total=total("worker"), launcher=total("launcher"))
