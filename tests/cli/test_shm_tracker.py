"""A worker's engine tree leaves no named semaphore in /dev/shm, however it dies (cli/shm_tracker.py): real
processes, multiprocessing's spawn context making a Lock as vLLM's engine does, a real SIGKILL of the group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cli.shm_tracker import _tracker_alive, replay, shm_path, sweep_stale_records
from tests.harness.graph import wait_until

ROOT = Path(__file__).resolve().parents[2]
# The "worker": our tracker, then an "engine core" of multiprocessing's spawn context that makes a named Lock
# (/dev/shm/sem.mp-*) and holds it; prints the tracker's pid and the semaphore's file, then waits.
WORKER = textwrap.dedent("""
    import multiprocessing as mp, sys, time
    from pathlib import Path
    from cli.shm_tracker import start_shm_tracker

    def engine(queue):
        lock = mp.get_context("spawn").Lock()
        queue.put(lock._semlock.name)
        time.sleep(600)

    if __name__ == "__main__":
        tracker = start_shm_tracker(Path(sys.argv[1]))
        ctx = mp.get_context("spawn")
        queue = ctx.SimpleQueue()
        ctx.Process(target=engine, args=(queue,), daemon=True).start()
        print(tracker, "/dev/shm/sem." + queue.get().lstrip("/"), flush=True)
        time.sleep(600)
""")


def _start(tmp_path: Path) -> tuple[subprocess.Popen, int, str]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True, start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    tracker, semaphore = proc.stdout.readline().split()
    assert os.path.exists(semaphore), semaphore
    # The tracker has read the registration from its pipe (a SIGKILL before that loses it: it was never known).
    name = "/" + semaphore.removeprefix("/dev/shm/sem.")
    record = tmp_path / f"{tracker}.names"
    assert wait_until(lambda: record.exists() and f"+ semaphore:{name}" in record.read_text(), timeout_s=10)
    return proc, int(tracker), semaphore


def _kill_group(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)  # what `up` does to a dead worker's group
    proc.wait()


def test_a_killed_group_leaves_no_semaphore(tmp_path: Path) -> None:
    proc, tracker, semaphore = _start(tmp_path)
    assert (tmp_path / f"{tracker}.names").exists()
    _kill_group(proc)
    # The tracker was in a session of its own: the group's SIGKILL missed it; it unlinks the name at EOF.
    assert wait_until(lambda: not os.path.exists(semaphore), timeout_s=20), f"{semaphore} left"
    assert wait_until(lambda: not (tmp_path / f"{tracker}.names").exists(), timeout_s=10)


def test_a_killed_tracker_s_record_is_swept_by_the_next_start(tmp_path: Path) -> None:
    proc, tracker, semaphore = _start(tmp_path)
    os.kill(tracker, signal.SIGKILL)  # the OOM killer, or `kill -9` of everything
    _kill_group(proc)
    assert wait_until(lambda: not _tracker_alive(tracker), timeout_s=10)
    assert os.path.exists(semaphore), "nothing unlinked it: the record is all that knows"
    # The worker's own queue's semaphores are in the record too (unlinked by then, or now).
    assert semaphore in sweep_stale_records(tmp_path)
    assert not os.path.exists(semaphore) and not list(tmp_path.glob("*.names"))


def test_the_sweep_leaves_a_live_tracker_s_names_and_files_still_mapped(tmp_path: Path) -> None:
    proc, tracker, semaphore = _start(tmp_path)
    try:
        assert sweep_stale_records(tmp_path) == [] and os.path.exists(semaphore)  # its tracker lives
        os.kill(tracker, signal.SIGKILL)
        assert wait_until(lambda: not _tracker_alive(tracker), timeout_s=10)
        # Dead tracker, but the engine process still maps the semaphore: it is in use, not leaked.
        assert sweep_stale_records(tmp_path) == [] and os.path.exists(semaphore)
    finally:
        _kill_group(proc)
    # Its tracker dead and nothing mapping them now: the next sweep takes the engine's semaphore and the worker's
    # own queue's two (left in /dev/shm by every run of this test before it swept).
    assert semaphore in sweep_stale_records(tmp_path)
    assert not os.path.exists(semaphore) and not list(tmp_path.glob("*.names"))


@pytest.mark.parametrize(("lines", "held"), [
    ([], {}),
    (["+ semaphore:/mp-a"], {"/mp-a": "semaphore"}),
    (["+ semaphore:/mp-a", "- semaphore:/mp-a"], {}),
    (["+ semaphore:/mp-a", "+ shared_memory:/psm_b", "- semaphore:/mp-a"], {"/psm_b": "shared_memory"}),
    (["+ semaphore:/mp-a", "+ semaphore:/mp-a"], {"/mp-a": "semaphore"}),
    (["- semaphore:/mp-x", "garbage", "+ semaphore:"], {}),  # a torn last line (killed mid-write) is ignored
])
def test_replay(lines: list[str], held: dict[str, str]) -> None:
    assert replay(lines) == held


def test_shm_path() -> None:
    assert shm_path("semaphore", "/mp-ab12") == "/dev/shm/sem.mp-ab12"
    assert shm_path("shared_memory", "/psm_ab12") == "/dev/shm/psm_ab12"
    assert shm_path("noop", "x") is None
