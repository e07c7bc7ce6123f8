"""A local graph (`splitserve up`) for a benchmark: start it, ask its router who serves, stop it and its tree."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import zmq.asyncio

from cli.launcher import free_port
from common.protocol import ListWorkers, WorkerList
from common.transport import Client, new_id

REPO = Path(__file__).resolve().parents[2]


def tree_pids(pid: int) -> list[int]:
    """``pid`` and every descendant (from /proc), children before their parents are gone."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


class LocalGraph:
    def __init__(self, up_args: list[str], log_path: Path) -> None:
        self.port, self.router_port = free_port(), free_port()
        self.router = f"tcp://127.0.0.1:{self.router_port}"
        self.log_path = log_path
        self.cmd = [sys.executable, "-m", "cli.main", "up", "--port", str(self.port), "--router-port",
                    str(self.router_port), *up_args]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 300.0) -> float:
        """Seconds until every worker registered (the launcher's banner)."""
        t0 = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, "OMP_NUM_THREADS": "1"})
        while "splitserve is serving" not in self.log_path.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() - t0 > timeout_s:
                self.stop()
                raise RuntimeError(f"graph did not come up; see {self.log_path}")
            time.sleep(0.3)
        return time.monotonic() - t0

    async def workers(self) -> WorkerList:
        ctx = zmq.asyncio.Context()
        client = Client(ctx, self.router)
        try:
            reply = await client.request(ListWorkers(request_id=new_id("bench")), 5.0)
            assert isinstance(reply, WorkerList)
            return reply
        finally:
            await client.close()
            ctx.destroy(linger=0)

    def stop(self) -> list[int]:
        """SIGTERM the launcher (it stops its children); SIGKILL what of its tree is left; returns those pids."""
        if self.proc is None:
            return []
        tree = tree_pids(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        time.sleep(0.5)
        alive = [p for p in tree if Path(f"/proc/{p}").exists() and p != self.proc.pid]
        for p in alive:  # only processes this graph started
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return alive
