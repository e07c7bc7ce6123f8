"""`splitserve frontend --processes N`: N frontend processes on one port, under one command.

What an operator of one systemd unit or one container expects (gunicorn's and uvicorn's ``--workers``, nginx's
``worker_processes``): one service, one port, one log stream, one restart policy, using N cores. This process
binds nothing itself; it starts N copies of its own command line, each a whole frontend with its own event loop
on the shared port (SO_REUSEPORT, the kernel spreading connections over them), and:

- restarts a copy that exits, so the other N-1 keep their streams (more than ``MAX_RESTARTS_PER_MIN`` crashes in a
  minute stop them all and exit 1, leaving the restart to systemd or the container runtime);
- forwards SIGTERM and SIGINT to every copy and waits for them (each finishes as a single frontend does);
- makes each copy die with it (PR_SET_PDEATHSIG, cli/child_setup.py).

Copy ``i`` serves its own /metrics on ``--metrics-port`` + i when a metrics port is given (on the shared port,
/metrics answers from whichever process the kernel picked).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import structlog

from cli.child_setup import launcher_env

log = structlog.get_logger(__name__)

PROCESS_INDEX_ENV = "SPLITSERVE_FRONTEND_PROCESS_INDEX"  # set on each copy: it is one process, number i
MAX_RESTARTS_PER_MIN = 5


def process_index() -> int | None:
    """This process's number among ``--processes`` copies; None when it was started by hand (or by `up`)."""
    text = os.environ.get(PROCESS_INDEX_ENV, "")
    return int(text) if text.isdigit() else None


def copy_metrics_port(metrics_port: int, index: int | None) -> int:
    """Copy ``index``'s own metrics port: consecutive ports from ``metrics_port`` (0 stays 0: none)."""
    return metrics_port + index if metrics_port and index is not None else metrics_port


def gives_up(restart_times_s: list[float], now_s: float, max_per_min: int = MAX_RESTARTS_PER_MIN) -> bool:
    """After one more crash at ``now_s``: too many in the last minute to keep restarting?"""
    return sum(1 for t in restart_times_s if now_s - t < 60.0) + 1 > max_per_min


def supervise(num_processes: int) -> int:
    """Run ``num_processes`` copies of this command until a signal (0) or a crash loop (1)."""
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda sig, _: stopping.append(sig))
    signal.signal(signal.SIGINT, lambda sig, _: stopping.append(sig))
    cmd = [sys.executable, *sys.orig_argv[1:]]  # this very invocation: `python -m cli.main frontend` or the script

    def spawn(i: int) -> subprocess.Popen[bytes]:
        env = {**os.environ, PROCESS_INDEX_ENV: str(i), **launcher_env(os.getpid(), frozenset())}
        proc = subprocess.Popen(cmd, env=env)
        log.info("frontend_process_started", index=i, pid=proc.pid)
        return proc

    procs = [spawn(i) for i in range(num_processes)]
    restarts: list[float] = []
    code = 0
    while not stopping:
        for i, proc in enumerate(procs):
            if proc.poll() is None or stopping:
                continue
            now = time.monotonic()
            log.error("frontend_process_exited", index=i, pid=proc.pid, returncode=proc.returncode)
            if gives_up(restarts, now):
                code = 1
                stopping.append(signal.SIGINT)
                break
            restarts[:] = [t for t in restarts if now - t < 60.0] + [now]
            procs[i] = spawn(i)
        time.sleep(0.2)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(stopping[0])
    for proc in procs:
        proc.wait()
    log.info("frontend_processes_stopped", num_processes=num_processes, returncode=code)
    return code
