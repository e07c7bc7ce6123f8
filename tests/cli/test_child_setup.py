"""A child of `up` applies its cores and parent-death signal itself, at start (no preexec_fn in a threaded
launcher): real processes, tiny ones (python -c)."""

from __future__ import annotations

import pytest

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.harness.graph import wait_until
from cli.child_setup import launcher_env

REPO = Path(__file__).resolve().parents[2]
REPORT = """
import ctypes, json, os
from cli.child_setup import apply_launcher_setup
apply_launcher_setup()
sig = ctypes.c_int()
ctypes.CDLL("libc.so.6").prctl(2, ctypes.byref(sig))  # PR_GET_PDEATHSIG
print(json.dumps({"cores": sorted(os.sched_getaffinity(0)), "sig": sig.value,
                  "env": sorted(k for k in os.environ if k.startswith("SPLITSERVE_LAUNCHER")),
                  "batch": os.sched_getscheduler(0) == os.SCHED_BATCH}))
"""


def run_child(code: str, extra_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), **extra_env}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_child_pins_itself_sets_its_death_signal_and_clears_the_variables() -> None:
    core = min(os.sched_getaffinity(0))
    result = run_child(REPORT, launcher_env(os.getpid(), frozenset({core})))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"cores": [core], "sig": int(signal.SIGINT), "env": [], "batch": False}


def test_child_asked_to_batch_runs_under_sched_batch() -> None:
    result = run_child(REPORT, launcher_env(os.getpid(), frozenset(), batch=True))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["batch"] is True and json.loads(result.stdout)["env"] == []


def test_a_refused_sched_batch_leaves_the_child_running_under_the_default_policy() -> None:
    # As a seccomp profile or a container runtime that refuses sched_setscheduler would.
    refusing = ("import os\ndef refuse(*_):\n    raise PermissionError(1, 'Operation not permitted')\n"
                "os.sched_setscheduler = refuse\n")
    result = run_child(refusing + REPORT, launcher_env(os.getpid(), frozenset(), batch=True))
    assert result.returncode == 0, result.stderr
    assert "SCHED_BATCH refused" in result.stderr and json.loads(result.stdout)["batch"] is False


def test_without_the_variables_nothing_changes() -> None:
    result = run_child(REPORT, {})
    assert json.loads(result.stdout) == {"cores": sorted(os.sched_getaffinity(0)), "sig": 0, "env": [],
                                         "batch": False}


def test_cores_the_machine_lacks_are_left_unapplied() -> None:
    result = run_child(REPORT, launcher_env(os.getpid(), frozenset({(os.cpu_count() or 1) + 1000})))
    assert json.loads(result.stdout)["cores"] == sorted(os.sched_getaffinity(0))


def test_a_launcher_gone_before_the_child_started_stops_it() -> None:
    result = run_child(REPORT, launcher_env(1, frozenset()))  # pid 1 is not our parent: as if reparented
    assert result.returncode != 0 and "launcher 1 has exited" in result.stderr


@pytest.mark.parametrize("sigint_ignored", [False, True])
def test_the_child_dies_with_its_launcher(sigint_ignored: bool) -> None:
    # sigint_ignored: `up` started by a script as `splitserve up &` (a shell without job control starts background
    # commands with SIGINT ignored, and children inherit that), the death signal must still stop the child.
    child = ("from cli.child_setup import apply_launcher_setup; apply_launcher_setup(); "
             "import time; print('ready', flush=True); time.sleep(60)")
    launcher = ("import os, signal, subprocess, sys, time; from cli.child_setup import launcher_env; "
                + ("signal.signal(signal.SIGINT, signal.SIG_IGN); " if sigint_ignored else "") +
                f"c = subprocess.Popen([sys.executable, '-c', {child!r}], "
                "env={**os.environ, **launcher_env(os.getpid(), frozenset())}); "
                "print(c.pid, flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", launcher], env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        child_pid = int(proc.stdout.readline())
        assert proc.stdout.readline().strip() == "ready"
        assert alive(child_pid)
        proc.kill()  # SIGKILL: the launcher runs no clean-up of its own
        proc.wait()
        assert wait_until(lambda: not alive(child_pid), timeout_s=30)
    finally:
        proc.kill()
        proc.wait()

