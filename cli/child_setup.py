"""What a child of `splitserve up` sets on itself at start: die with the launcher, its CPU cores and its CPU
scheduling policy (cli/cpu_sched.py).

The launcher passes both in the environment instead of applying them in a ``preexec_fn``: it forks while threads
run (ZeroMQ's I/O threads, for the planner's events), and code run between fork and exec in a threaded process can
deadlock on a lock another thread held at the fork (Python's subprocess docs warn against it). The child applies
them first thing, single-threaded, then removes them from its environment so its own children (vLLM's engine
processes) do not act on them. Both settings survive the worker's re-exec (``reexec_with_engine_env``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import MutableMapping

PARENT_PID_ENV = "SPLITSERVE_LAUNCHER_PID"  # die (SIGINT) when this process, our parent, does
CORES_ENV = "SPLITSERVE_LAUNCHER_CORES"  # comma-separated CPU ids to run on ("" or absent: leave as is)
SCHED_ENV = "SPLITSERVE_LAUNCHER_SCHED"  # "batch": run under SCHED_BATCH ("" or absent: leave as is)
_PR_SET_PDEATHSIG = 1


def launcher_env(parent_pid: int, cores: frozenset[int], batch: bool = False) -> dict[str, str]:
    """The variables the launcher adds to a child's environment."""
    return {PARENT_PID_ENV: str(parent_pid), CORES_ENV: ",".join(str(c) for c in sorted(cores)),
            SCHED_ENV: "batch" if batch else ""}


def apply_launcher_setup(environ: MutableMapping[str, str] = os.environ) -> None:
    parent = environ.pop(PARENT_PID_ENV, "")
    cores_text = environ.pop(CORES_ENV, "")
    if environ.pop(SCHED_ENV, "") == "batch":
        # Before any thread starts (ZeroMQ's I/O thread inherits it). Needs no privilege (priority 0, not
        # real-time), but a sandbox may refuse the call: the policy only saves CPU, so the service runs without it.
        try:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        except OSError as exc:
            print(f"splitserve: SCHED_BATCH refused ({exc}); running under the default policy", file=sys.stderr)
    if cores_text:
        cores = {int(c) for c in cores_text.split(",")}
        if cores <= os.sched_getaffinity(0):  # a launcher's choice this machine cannot honour is left unapplied
            os.sched_setaffinity(0, cores)
    if parent:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        # SIGINT: stop at once (SIGTERM would make a worker drain, with no launcher left to serve). A launcher
        # started in the background by a script (`splitserve up &`: no job control) hands its children SIGINT
        # ignored, and Python keeps an ignored SIGINT ignored: restore Python's handler, or the signal is lost.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGINT)
        if os.getppid() != int(parent):
            # The launcher died before the line above: no signal will come, so stop now.
            sys.exit(f"splitserve: launcher {parent} has exited")
